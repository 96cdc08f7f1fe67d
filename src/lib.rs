//! # kvrun — LLM inference on any wgpu GPU, with the KV cache as a first-class citizen
//!
//! One crate, library + binary. GPU work is WGSL compute shaders run through wgpu (Vulkan, Metal,
//! DX12). The KV cache lives only in a paged block pool read through per-sequence block tables.
//!
//! ## Module map (rooms; data flows top to bottom)
//!
//! | room | owns | may import |
//! |---|---|---|
//! | [`gpu`] | instance/adapter/device/queue, capability probe, typed buffers, pipeline cache, readback, timestamps | wgpu |
//! | [`kernels`] | host half of each WGSL kernel (params, bindings, dispatch size, preconditions); [`kernels::reference`] = plain f32 CPU versions | gpu, quant |
//! | [`quant`] | number formats: GGUF weight blocks, KV formats, CPU (de)quantization | — |
//! | [`loader`] | GGUF and HF (config.json + safetensors) → [`loader::ModelConfig`] + host tensors (mmap) | quant |
//! | [`tokenizer`] | `tokenizers` wrapper, GGUF vocab → tokenizer, chat templates | — |
//! | [`model`] | architectures as flat lists of dispatches; weights, activations, KV pool buffers on the GPU | kernels, gpu, loader |
//! | [`kv`] | host-side KV bookkeeping, no GPU: layout byte math, block pool, block tables, prefix cache (radix tree) | — |
//! | [`sched`] | requests, sequence states, continuous batching (token budget, chunked prefill, admission, preemption) → `StepPlan` | kv |
//! | [`sample`] | sampling parameters, seeded RNG, greedy fast path | kernels |
//! | [`output`] | incremental detokenizer, stop conditions, finish reasons | tokenizer |
//! | [`engine`] | the step loop ([`engine::Engine::step`]), per-request output state, Prometheus metrics, [`engine::EngineHandle`] (an engine on its own thread) | all above |
//! | [`bench`] | benchmark workloads and their reports (JSON, Markdown, SVG) | engine |
//! | [`cli`] | clap subcommands | engine, bench |
//!
//! `kv`, `sched`, `output` and `tokenizer` never import wgpu.
//!
//! ## One step
//!
//! ```text
//! Scheduler::schedule ─▶ StepPlan ─▶ ForwardBatch::new ─▶ Model::forward ─▶ Logits
//!   ─▶ sample ─▶ Scheduler::commit ─▶ TokenEvents ─▶ detokenize / stop strings ─▶ OutputEvents
//! ```
//!
//! Kernels are batch-invariant: a token's result is the same bits whichever step, batch or
//! kernel (prefill or decode) computed it, so prefix reuse and preemption never change greedy
//! outputs (`tests/engine_e2e.rs`). Each reduction is defined once, in `shaders/common/`.
//!
//! ## Glossary (one meaning each)
//!
//! *request* (user input) · *sequence* (its running state) · *block* (fixed run of `block_size`
//! KV token slots, the same slot range in every layer) · *slot* (one token's KV position:
//! `block_id * block_size + offset`) · *block table* (a sequence's block ids, in order) ·
//! *slot mapping* (slot of every token computed in a step) · *step* (one scheduler iteration,
//! one submit) · *prefill* / *decode* · *chunk* (part of a prefill in one step) · *prefix hit*
//! (leading whole blocks of a sequence found in the prefix cache) · *preemption* (a running
//! sequence gives its blocks back and is recomputed later).
//!
//! ## Request lifecycle (the [`sched`] side)
//!
//! ```text
//! add_request ─▶ waiting ─(admitted: prefix hit + first chunk)─▶ running: prefill chunks ─▶ decodes
//!                   ▲                                               │
//!                   └─────────── preempted (recompute) ─────────────┤
//!                                                                   ▼
//!                      finished (stop token, max_tokens, -c; or a stop string via finish) / cancelled
//! ```
#![deny(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod engine;
pub mod gpu;
pub mod kernels;
pub mod kv;
pub mod loader;
pub mod model;
pub mod output;
pub mod quant;
pub mod sample;
pub mod sched;
pub mod server;
pub mod tokenizer;
