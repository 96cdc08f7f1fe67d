//! Every kernel variant parses, validates and translates to SPIR-V (Vulkan), MSL (Metal) and
//! HLSL (DX12) with naga — so Metal/DX12 breakage shows up in plain `cargo test`, without the
//! hardware. Runs without a GPU.

use kvrun::kernels::{source, PipelineKey};

fn compile(key: PipelineKey) -> Result<(), String> {
    let wgsl = source::wgsl(key);
    let module = naga::front::wgsl::parse_str(&wgsl).map_err(|e| e.emit_to_string(&wgsl))?;
    // Kernels need only pack/unpack2x16float (all adapters but old llvmpipe without f16 have
    // it), and what their family's Kernel::features says: subgroups and 64-bit integers, which
    // the variants needing them are only chosen with (KernelConfig::choose). A kernel using
    // more than it declares fails validation here.
    let features = key.features();
    let (subgroup, int64) = (features.subgroups, features.int64);
    let mut caps = naga::valid::Capabilities::SHADER_FLOAT16_IN_FLOAT32;
    if subgroup {
        caps |= naga::valid::Capabilities::SUBGROUP;
    }
    if int64 {
        caps |= naga::valid::Capabilities::SHADER_INT64;
    }
    let mut validator = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps);
    if subgroup {
        validator
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all());
    }
    let info = validator.validate(&module).map_err(|e| e.emit_to_string(&wgsl))?;
    let mut constants = naga::back::PipelineConstants::default();
    for (name, value) in source::constants(key) {
        constants.insert(name.to_string(), value);
    }
    let ep = Some((naga::ShaderStage::Compute, "main"));
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(&module, &info, ep, &constants)
            .map_err(|e| format!("overrides: {e}"))?;

    let spv_opts = naga::back::spv::Options::default();
    naga::back::spv::write_vec(&module, &info, &spv_opts, None).map_err(|e| format!("spv: {e}"))?;

    let msl_opts = naga::back::msl::Options { lang_version: (2, 4), ..Default::default() };
    let msl_pipe = naga::back::msl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, "main".into())),
        ..Default::default()
    };
    naga::back::msl::write_string(&module, &info, &msl_opts, &msl_pipe)
        .map_err(|e| format!("msl: {e}"))?;

    let hlsl_opts = naga::back::hlsl::Options {
        shader_model: naga::back::hlsl::ShaderModel::V6_2,
        ..Default::default()
    };
    let hlsl_pipe = naga::back::hlsl::PipelineOptions {
        entry_point: Some((naga::ShaderStage::Compute, "main".into())),
    };
    let mut out = String::new();
    naga::back::hlsl::Writer::new(&mut out, &hlsl_opts, &hlsl_pipe)
        .write(&module, &info, None)
        .map_err(|e| format!("hlsl: {e}"))?;
    Ok(())
}

#[test]
fn every_kernel_variant_compiles_for_vulkan_metal_and_dx12() {
    let keys = source::all_keys();
    let distinct: std::collections::HashSet<_> = keys.iter().collect();
    assert_eq!(distinct.len(), keys.len(), "a family's Kernel::all lists a variant twice");
    eprintln!("compiling {} kernel variants", keys.len());
    let mut failures = Vec::new();
    for key in keys {
        if let Err(e) = compile(key) {
            failures.push(format!("{key:?}:\n{e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} kernel variants failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
