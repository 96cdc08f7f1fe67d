//! One builder per architecture, chosen from `ModelConfig::arch` in [`load`]: each turns the
//! config and the file's tensors into the flat op list of its forward pass.
//!
//! | file | concept |
//! |---|---|
//! | `common.rs` | [`Builder`]: the shared pieces (embedding, norms, fused projections, RoPE with the layer's table, attention with the layer's [`AttentionKind`], rotation, the final norm and LM head) and the checks every architecture needs |
//! | `llama.rs` | Llama, Mistral, SmolLM2, Qwen2 (q/k/v bias), Qwen3 (Q/K norms), Qwen3-MoE (experts: `Builder::moe_mlp`) |
//! | `gemma3.rs` | Gemma 3 (text): scaled embedding, Q/K norms, post-norms, GeGLU, per-layer RoPE base |
//! | `deepseek2.rs` | DeepSeek-V2/V3 with dense layers: multi-head latent attention, absorbed |
//! | `qwen35.rs` | Qwen3.5 and Qwen3.5-MoE: Gated DeltaNet layers with their states, gated full attention with partial RoPE |
//! | `moe.rs` | [`Builder::moe_mlp`]: a mixture-of-experts MLP (routing, experts, the shared expert) for Qwen3-MoE, DeepSeek-V2 and Qwen3.5-MoE |
//!
//! [`AttentionKind`]: crate::loader::AttentionKind

mod common;
mod deepseek2;
mod gemma3;
mod gemma4;
mod llama;
mod moe;
mod qwen35;

use std::sync::Arc;

use super::buffers::{Activations, KvPool, StatePool, StepBuffers};
use super::KvFit;
use super::{Model, ModelError, ModelOptions};
use crate::gpu::Gpu;
use crate::kernels::Kernels;
use crate::loader::{Architecture, ModelFile};
use common::Builder;

/// Checks the config against what the architecture's builder runs, allocates every buffer and
/// builds the op list.
pub(super) fn load(
    gpu: Arc<Gpu>,
    kernels: &Kernels,
    file: &ModelFile,
    mut options: ModelOptions,
    fit: Option<KvFit>,
) -> Result<Model, ModelError> {
    let c = file.config().clone();
    common::validate(&c, &options)?;
    if matches!(
        c.arch,
        Architecture::Llama
            | Architecture::Qwen2
            | Architecture::Qwen3
            | Architecture::Qwen3Moe
            | Architecture::GptOss
    ) {
        llama::check(&c)?;
    }
    let max_binding = kernels.config.max_binding_bytes;
    super::limits::check_buffer_sizes(&c, &options, max_binding)?;
    let scope = gpu.allocation_scope();
    let step = StepBuffers::new(&gpu, &options);
    let act = Activations::new(&gpu, &c, &options);
    let states = StatePool::new(&gpu, &c, &options);
    if let Some(fit) = fit {
        // the pool takes what the budget leaves after the buffers just allocated
        let used = step.bytes() + act.bytes();
        let room = fit.bytes.saturating_sub(used);
        let blocks = usize::try_from(room / fit.bytes_per_block.max(1)).unwrap_or(usize::MAX);
        // and no more than a slot's buffer can bind
        let cap = KvPool::max_blocks(&c, &options, max_binding)?;
        if blocks > cap {
            tracing::info!(
                "the KV pool takes {cap} blocks, not the {blocks} the memory left holds: one \
                 layer's K or V buffer may bind at most {max_binding} bytes on this adapter"
            );
        }
        options.num_blocks = blocks.min(cap);
        if options.num_blocks == 0 {
            return Err(ModelError::NoRoomForKv { budget: fit.bytes, activations: used });
        }
    }
    let kv = KvPool::new(&gpu, &c, &options, max_binding)?;
    let b = Builder {
        gpu: &gpu,
        kernels,
        file,
        c: &c,
        o: &options,
        step: &step,
        act: &act,
        kv: &kv,
        states: &states,
        max_binding,
    };
    let (ops, weight_bytes) = match c.arch {
        Architecture::Llama
        | Architecture::Qwen2
        | Architecture::Qwen3
        | Architecture::Qwen3Moe
        | Architecture::GptOss => b.build(llama::layer)?,
        Architecture::Gemma3 => b.build(gemma3::layer)?,
        Architecture::Gemma4 => b.build(gemma4::layer)?,
        Architecture::Deepseek2 => b.build(deepseek2::layer)?,
        Architecture::Qwen35 => b.build(qwen35::layer)?,
    };
    scope.finish(
        "the weights, activations and KV pool",
        weight_bytes + kv.bytes + kv.staging_bytes + states.bytes,
    )?;
    // every layer's prefill tile (AttentionOp::for_heads_of)
    let dims = c.head_shapes().iter().map(|&(_, hd)| hd as u32).collect::<Vec<_>>();
    let query_tile = crate::kernels::attention::model_query_tile(&kernels.config, &dims) as usize;
    Ok(Model {
        gpu,
        config: c,
        options,
        ops,
        step,
        act,
        kv,
        states,
        weight_bytes,
        timer: None,
        timing: super::Timing::Off,
        query_tile,
    })
}
