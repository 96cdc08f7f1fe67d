//! `kvrun info`: the adapter, backend, driver, features and limits kvrun will use.

use crate::gpu::{Gpu, GpuOptions};
use crate::kernels::KernelConfig;

#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(serde::Serialize)]
struct Info {
    adapter: String,
    backend: String,
    device_type: String,
    driver: String,
    driver_info: String,
    capabilities: crate::gpu::Capabilities,
    /// What kvrun may allocate on the adapter (`budget_bytes`, `heap_bytes`, `source`).
    memory: crate::gpu::DeviceMemory,
    kernels: KernelConfig,
    adapters: Vec<String>,
}

pub fn run(args: &InfoArgs, gpu_opts: &GpuOptions) -> anyhow::Result<()> {
    let gpu = Gpu::open(gpu_opts)?;
    let info = Info {
        adapter: gpu.info.name.clone(),
        backend: format!("{:?}", gpu.info.backend),
        device_type: format!("{:?}", gpu.info.device_type),
        driver: gpu.info.driver.clone(),
        driver_info: gpu.info.driver_info.clone(),
        capabilities: gpu.caps.clone(),
        memory: gpu.memory,
        kernels: KernelConfig::choose(&gpu.caps),
        adapters: Gpu::list_adapters(gpu_opts),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&info)?);
        return Ok(());
    }
    let c = &info.capabilities;
    println!("adapter      {} ({}, {})", info.adapter, info.backend, info.device_type);
    println!("driver       {} {}", info.driver, info.driver_info);
    println!(
        "features     shader-f16: {}  subgroups: {} (size {}..{})  timestamps: {}",
        c.shader_f16, c.subgroups, c.subgroup_min_size, c.subgroup_max_size, c.timestamps
    );
    println!(
        "limits       max storage binding {} B, max buffer {} B",
        c.max_storage_buffer_binding_size, c.max_buffer_size
    );
    println!(
        "             workgroup memory {} B, invocations/workgroup {}, workgroups/dim {}, storage buffers/stage {}",
        c.max_compute_workgroup_storage_size,
        c.max_compute_invocations_per_workgroup,
        c.max_compute_workgroups_per_dimension,
        c.max_storage_buffers_per_shader_stage
    );
    let m = &info.memory;
    match m.budget_bytes {
        Some(b) => println!(
            "memory       budget {} ({:?}), largest device-local heap {}",
            crate::kv::format_bytes(b),
            m.source,
            m.heap_bytes.map_or("unknown".to_string(), crate::kv::format_bytes)
        ),
        None => println!("memory       unknown (this backend reports no size)"),
    }
    println!("all adapters {}", info.adapters.join("; "));
    Ok(())
}
