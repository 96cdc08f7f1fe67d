//! # kvrun — LLM inference on any wgpu GPU, with the KV cache as a first-class citizen
//!
//! One crate, library + binary. GPU work is WGSL compute shaders run through wgpu (Vulkan, Metal,
//! DX12). The KV cache lives only in a paged block pool read through per-sequence block tables.
//!
//! ## Module map (rooms; data flows top to bottom)
//!
//! | room | owns | imports |
//! |---|---|---|
//! | [`gpu`] | instance/adapter/device/queue, capability probe, buffers, pipeline cache, readback, timestamps | wgpu |
//! | [`kernels`] | host half of each WGSL kernel, one module per family (variants, key and its WGSL parts, params, bindings, dispatch size, preconditions); [`kernels::reference`] = plain f32 CPU versions | gpu, loader, quant |
//! | [`quant`] | number formats: GGUF weight blocks, KV formats, CPU (de)quantization | — |
//! | [`loader`] | GGUF and HF (config.json + safetensors) → [`loader::ModelConfig`] + host tensors (mmap); tokenizer sources | quant, tokenizer |
//! | [`tokenizer`] | `tokenizers` wrapper, GGUF vocab → tokenizer, chat templates | — |
//! | [`model`] | architectures as flat lists of dispatches; weights, activations, KV pool buffers on the GPU | gpu, kernels, loader, quant |
//! | [`kv`] | host-side KV bookkeeping, no GPU: layout byte math, block pool, block tables, prefix cache (radix tree), tenant quotas | — |
//! | [`sched`] | requests, sequence states, continuous batching (token budget, chunked prefill, admission, preemption) → `StepPlan` | kv, output (`FinishReason`) |
//! | [`sample`] | sampling parameters, seeded RNG, greedy fast path; the GPU draw's parameters and logit edits | kernels (`RowSampling`, `LogitEdit`, plain data) |
//! | [`constrain`] | structured outputs: a request's constraint (JSON schema, regex, choice, Lark, tool calls in a family's syntax) compiled by llguidance over the model's vocabulary; per-sequence token masks | — (tokenizers, llguidance) |
//! | [`output`] | incremental detokenizer, stop conditions (the one place that decides stopping), [`output::FinishReason`], a chat answer's parsers ([`output::AnswerParser`]: `<think>` reasoning, tool calls per family format, gpt-oss's harmony channels) | tokenizer |
//! | [`engine`] | the front end ([`engine::Frontend`]: chat template, tokenize, checks), the step loop ([`engine::Engine::step`]), per-request output state, Prometheus metrics, [`engine::EngineHandle`] (an engine on its own thread) | all above |
//! | [`server`] | `kvrun serve`: OpenAI-compatible HTTP + SSE (`n` choices, tools, structured outputs, log-probabilities), Anthropic's `/v1/messages`, the chat page, `/metrics`, tenants; talks to the engine only through its handle | engine, output, sched, sample, tokenizer, constrain |
//! | [`bench`] | benchmark workloads and their reports (JSON, Markdown, SVG); `bench serve` over HTTP | engine, gpu, kernels (the bandwidth probes), kv, loader, model, quant, sched, tokenizer |
//! | [`cli`] | clap subcommands | every room |
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
//! outputs (`tests/engine_e2e.rs`). Each reduction is defined once, in `shaders/common/` (the
//! attention partition's per family: `attention_workgroup.wgsl`, `attention_lanes.wgsl`).
//!
//! ## Glossary (one meaning each)
//!
//! *request* (user input) · *sequence* (its running state) · *block* (fixed run of `block_size`
//! KV token slots, the same slot range in every layer of its KV-cache group) · *KV-cache group*
//! (layers of one attention kind, full or sliding window, sharing block tables; `kv::KvGroups`)
//! · *slot* (one token's KV position: `block_id * block_size + offset`) · *block table* (a
//! sequence's block ids in one group, in order; blocks out of a sliding window are null) ·
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
//!        finished: the engine's output stage decides (stop token, max_tokens, stop string) and
//!        calls finish; the scheduler ends only a sequence whose context (-c) is full / cancelled
//! ```
#![deny(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod constrain;
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
