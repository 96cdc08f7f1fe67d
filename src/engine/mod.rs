//! The engine: a model on a GPU with its tokenizer, scheduler and per-request output state.
//!
//! One step reads left to right ([`Engine::step`]):
//!
//! ```text
//! fetch_from_disk()                          --kv-cache-dir: blocks waiting prompts need → host
//! plan    = scheduler.schedule()            which tokens of which sequences run now
//! moves(plan.kv_moves)                       host tier: evicted blocks down, host hits up
//! batch   = ForwardBatch::new(plan)          token ids, positions, slot mapping, block tables
//! logits  = model.forward(batch)             one submit
//! sampled = sample(plan, logits)             one token per sequence that ends its prompt or decodes
//! events  = scheduler.commit(plan, sampled)  append tokens, cache full blocks, end sequences
//! output(events)                             detokenize, stop strings → OutputEvents
//! ```
//!
//! [`Engine`] is driven by its caller (CLI commands, benchmarks); [`EngineHandle`] runs one on
//! its own thread for servers and embedding applications.

mod config;
mod frontend;
mod generate;
mod handle;
mod host_kv;
mod kv_disk;
pub mod metrics;
mod perplexity;
mod requests;
mod stage_slots;

use host_kv::HostKvStore;
use kv_disk::DiskKvStore;
pub use kv_disk::DiskTierStats;
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

pub use crate::loader::SamplingDefaults;
pub use config::{
    check_device_memory, kv_fit, kv_groups, kv_groups_at, kv_storage, model_kv_layout,
    model_kv_storage, slots_for_pool, tenant_namespace, EngineConfig, KvQuota, ResolvedConfig,
    TenantConfig, DEFAULT_MAX_MODEL_LEN_CAP, DEFAULT_STATE_SNAPSHOTS_PER_SEQ,
};
pub use frontend::{Conversation, Frontend, FrontendError, Prompt, PromptRequest};
pub use generate::{GenerateOutput, GenerateRequest};
pub use handle::{EngineHandle, RequestStream, StreamEvent};
pub use perplexity::{kl_divergence, nll, KldReport, PerplexityOptions, PerplexityReport};
pub use requests::{CompletionRequest, OutputEvent, RequestTiming};

use crate::gpu::{Gpu, GpuError};
use crate::kernels::logit_edit::LogitEdit;
use crate::kernels::sampling::RowSampling;
use crate::kernels::{KernelConfig, Kernels};
use crate::kv::{KvError, KvLayout, KvManager};
use crate::loader::{LoadError, ModelFile};
use crate::model::{
    ForwardBatch, LogitReadback, Logits, LogitsWanted, Model, ModelError, ModelOptions, SeqChunk,
    StateWork,
};
use crate::quant::KvQuantError;
use crate::sched::{RequestId, SchedError, Scheduler, SchedulerConfig, StepPlan};
use crate::tokenizer::{ChatTemplate, Tokenizer, TokenizerError};
use metrics::Metrics;
use requests::Active;
use stage_slots::StageSlots;

/// Errors of the engine, each naming what to do.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error(transparent)]
    KvQuant(#[from] KvQuantError),
    #[error(transparent)]
    Sched(#[from] SchedError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Frontend(#[from] FrontendError),
    #[error("{0}")]
    Config(String),
    /// The KV cache asked for (with the weights) exceeds the adapter's memory
    /// ([`check_device_memory`]).
    #[error("{0}")]
    DeviceMemory(String),
    #[error("{0}")]
    Sampling(#[from] crate::sample::SampleError),
    #[error("the engine is busy with requests; {0} needs it idle")]
    Busy(&'static str),
    #[error("the engine thread has stopped")]
    Stopped,
}

/// A model on a GPU, ready to run requests.
pub struct Engine {
    gpu: Arc<Gpu>,
    model: Model,
    /// Tokenizer, chat template and context length: prompts to token ids.
    frontend: Arc<Frontend>,
    sched: Scheduler,
    resolved: ResolvedConfig,
    layout: KvLayout,
    model_max_len: usize,
    requests: HashMap<RequestId, Active>,
    next_id: RequestId,
    metrics: Arc<Metrics>,
    /// Quantized KV: the staging slot of each running sequence.
    stage_slots: StageSlots,
    /// Tracked tenants' names by namespace, for per-tenant metrics.
    tenants: HashMap<u64, String>,
    /// Prompt logits computed for requests that asked for them, until taken.
    prompt_logits: HashMap<RequestId, Vec<Vec<f32>>>,
    /// Requests' prompt next-token log-probabilities ([`CompletionRequest::prompt_logprobs_only`]).
    prompt_logprobs: HashMap<RequestId, Vec<f32>>,
    /// Most blocks the running sequences held at once, per KV-cache group, since the last
    /// [`Engine::take_peak_kv_blocks`] (measured each step once its blocks are reserved).
    peak_kv_blocks: Vec<usize>,
    /// [vocab] a constrained sequence's logits with its grammar's mask applied: scratch.
    masked: Vec<f32>,
    /// Whether random sampling draws on the GPU ([`KernelConfig::gpu_sampling`]).
    gpu_sampling: bool,
    /// The host tier's bytes (`--kv-offloading-size`).
    host_kv: Option<HostKvStore>,
    /// The disk tier (`--kv-cache-dir`).
    disk: Option<DiskKvStore>,
}

/// `--kv-cache-dir-size` when not given.
const DEFAULT_KV_CACHE_DIR_SIZE: u64 = 4 << 30;
/// The host tier a disk tier brings when `--kv-offloading-size` is not given (at most).
const DEFAULT_DISK_HOST_TIER: u64 = 1 << 30;
/// Most blocks read from the disk tier before one step.
const MAX_DISK_FETCH_PER_STEP: usize = 256;

impl Drop for Engine {
    /// With a disk tier, the cached blocks are written before the engine goes.
    fn drop(&mut self) {
        if self.disk.is_some() {
            match self.persist_kv_cache() {
                Ok(n) => tracing::info!("--kv-cache-dir: {n} blocks written at shutdown"),
                Err(e) => tracing::warn!("--kv-cache-dir: blocks not written at shutdown: {e}"),
            }
        }
    }
}

impl Engine {
    /// Opens the GPU, reads the model file, uploads the weights and allocates the KV pool.
    pub fn load(cfg: &EngineConfig) -> Result<Self, EngineError> {
        let file = ModelFile::open(&cfg.model)?;
        if cfg.gpu_memory_utilization.is_some() && cfg.kv_cache_memory.is_some() {
            return Err(EngineError::Config(
                "--gpu-memory-utilization and --kv-cache-memory both size the KV cache; give one"
                    .into(),
            ));
        }
        let (resolved, layout) = ResolvedConfig::resolve(cfg, file.config())?;
        let gpu = Arc::new(Gpu::open(&cfg.gpu)?);
        let kernels =
            Kernels::with_config(KernelConfig::choose_family(&gpu.caps, cfg.kernel_family));
        let utilization = cfg.utilization_on(gpu.caps.is_cpu);
        // the pool's bytes bound the fewest slots a block may hold (`kv/groups.rs`); a fraction
        // that leaves no pool is refused below, once the state snapshots are fitted
        let pool_bytes = match utilization {
            Some(f) => kv_fit(f, &resolved, &layout, gpu.memory, file.weight_bytes())
                .map_or(0, |f| f.bytes),
            None => resolved.kv_cache_memory,
        };
        let max_binding = kernels.config.max_binding_bytes;
        let gpu_sampling = kernels.config.gpu_sampling;
        let (mut resolved, layout) =
            resolved.fit_slots_to_binding(layout, cfg, file.config(), pool_bytes, max_binding)?;
        resolved.fit_logit_rows(file.config().vocab_size, kernels.config.max_binding_bytes);
        let recurrent_slot = file.config().delta_net.map_or(0, |d| d.recurrent_state_bytes());
        resolved.fit_state_snapshots(cfg, recurrent_slot, kernels.config.max_binding_bytes);
        if utilization != cfg.gpu_memory_utilization {
            tracing::info!(
                "the KV cache takes {} of the device's memory (give --kv-cache-memory or \
                 --gpu-memory-utilization to choose)",
                utilization.unwrap_or_default()
            );
        }
        let model = match utilization {
            Some(f) => {
                let fit = kv_fit(f, &resolved, &layout, gpu.memory, file.weight_bytes())?;
                let options = model_options(&resolved);
                let model = Model::load_fitting(gpu.clone(), &kernels, &file, options, fit)?;
                resolved.fit_pool(cfg, model.kv_pool().num_blocks, &layout)?;
                model
            }
            None => {
                check_device_memory(cfg, &resolved, gpu.memory, file.weight_bytes())?;
                Model::load(gpu.clone(), &kernels, &file, model_options(&resolved))?
            }
        };
        let mut tokenizer = file.tokenizer()?;
        if let Some(path) = &cfg.chat_template_file {
            let source = std::fs::read_to_string(path).map_err(|e| {
                EngineError::Config(format!(
                    "cannot read --chat-template-file {}: {e}",
                    path.display()
                ))
            })?;
            tokenizer = tokenizer.with_chat_template(source, path.display().to_string());
        }
        let model_max_len = file.config().max_position_embeddings;
        let frontend = Frontend::new(tokenizer, resolved.max_model_len, model_max_len)?
            .with_sampling_defaults(file.sampling_defaults());
        let frontend = Arc::new(frontend);
        let mut kv = KvManager::with_groups(
            layout,
            resolved.kv_groups.clone(),
            resolved.num_blocks,
            resolved.enable_prefix_cache,
        )?;
        if resolved.state_snapshots > 0 {
            // recurrent layers: a cached prefix is usable where a state snapshot ends it
            kv = kv.with_state_snapshots(resolved.state_snapshots as u32);
        }
        // Tenant quotas count recurrent states as whole blocks' worth of bytes.
        let state_blocks = resolved.state_bytes_per_sequence.div_ceil(layout.bytes_per_block());
        let state_blocks = usize::try_from(state_blocks).unwrap_or(usize::MAX / 4);
        kv = kv.with_sequence_states(state_blocks, resolved.max_num_seqs);
        let sched_config = SchedulerConfig {
            max_num_seqs: resolved.max_num_seqs,
            max_num_batched_tokens: resolved.max_num_batched_tokens,
            max_model_len: resolved.max_model_len,
            max_logit_rows: resolved.max_logit_rows,
        };
        let block_bytes = model.kv_block_bytes();
        let disk_size = cfg.kv_cache_dir_size.unwrap_or(DEFAULT_KV_CACHE_DIR_SIZE);
        // a disk tier reads and spills through a host tier: one of up to 1 GiB if none is given
        let host_size = cfg.kv_offloading_size.or(cfg
            .kv_cache_dir
            .as_ref()
            .map(|_| disk_size.min(DEFAULT_DISK_HOST_TIER).max(block_bytes)));
        let host_kv = match host_size {
            Some(size) => {
                let avail = crate::gpu::host_available_bytes();
                let (store, slots) = HostKvStore::new(size, block_bytes, avail)?;
                kv = kv.with_host_tier(slots)?;
                Some(store)
            }
            None => None,
        };
        let disk = match &cfg.kv_cache_dir {
            Some(dir) => {
                let what = format!("{} bs {} bytes {block_bytes}", cfg.kv_cache, cfg.block_size);
                let fingerprint = kv_disk::fingerprint(&cfg.model, &what)?;
                let store = DiskKvStore::open(dir, disk_size, fingerprint, block_bytes)?;
                kv.spill_host_drops();
                tracing::info!(
                    "--kv-cache-dir {}: {} blocks kept from earlier runs",
                    dir.display(),
                    store.len()
                );
                Some(store)
            }
            None => None,
        };
        let mut sched = Scheduler::new(sched_config, kv)?;
        let tenants = set_tenants(&mut sched, cfg, &layout)?;
        let stage_slots = StageSlots::new(resolved.max_num_seqs);
        let metrics = Arc::new(Metrics::new());
        metrics.set_cache_config(
            resolved.block_size,
            resolved.num_blocks,
            resolved.kv_cache_memory,
            utilization,
        );
        metrics.set_state_bytes_per_sequence(model.config().state_bytes_per_sequence());
        if host_kv.is_some() {
            metrics.set_host_tier(model.kv_block_bytes());
        }
        Ok(Engine {
            gpu,
            model,
            frontend,
            sched,
            resolved,
            layout,
            model_max_len,
            requests: HashMap::new(),
            next_id: 0,
            metrics,
            stage_slots,
            tenants,
            prompt_logits: HashMap::new(),
            prompt_logprobs: HashMap::new(),
            peak_kv_blocks: Vec::new(),
            masked: Vec::new(),
            gpu_sampling,
            host_kv,
            disk,
        })
    }

    /// Queues a request; its events come out of [`Engine::step`].
    pub fn add_request(&mut self, req: CompletionRequest) -> Result<RequestId, EngineError> {
        let id = self.next_id;
        self.next_id += 1;
        self.add_request_with_id(id, req)?;
        Ok(id)
    }

    /// Queues a request under a caller-chosen id (unique among unfinished requests).
    pub fn add_request_with_id(
        &mut self,
        id: RequestId,
        req: CompletionRequest,
    ) -> Result<(), EngineError> {
        req.validate()?;
        self.sched.add_request(req.to_sched(id)).map_err(|e| self.explain(e))?;
        self.update_metrics();
        let mut req = req;
        let grammar = req.grammar.take();
        let mut active = Active::new(&req, self.frontend.tokenizer(), self.resolved.max_model_len);
        active.grammar = grammar;
        self.requests.insert(id, active);
        self.next_id = self.next_id.max(id + 1);
        Ok(())
    }

    /// Runs one step of every unfinished request (nothing when there is none).
    pub fn step(&mut self) -> Result<Vec<OutputEvent>, EngineError> {
        self.fetch_from_disk()?;
        let plan = self.sched.schedule();
        if let Some(store) = &mut self.host_kv {
            // before the step reads or overwrites
            store.apply(&self.model, &plan.kv_moves, self.disk.as_mut())?;
        }
        if plan.is_empty() {
            return Ok(Vec::new());
        }
        // The step's blocks are reserved and the windows not yet slid: the most held at once.
        let held = self.sched.kv().held_blocks_by_group();
        self.peak_kv_blocks.resize(held.len(), 0);
        for (peak, now) in self.peak_kv_blocks.iter_mut().zip(held) {
            *peak = (*peak).max(now);
        }
        let batch = self.prepare(&plan);
        // The grammars' next-token masks are CPU work: done on a thread while the GPU runs.
        let (model, requests) = (&mut self.model, &mut self.requests);
        let logits = std::thread::scope(|scope| {
            let constrained: Vec<_> = requests
                .iter_mut()
                .filter(|(_, a)| a.grammar.as_ref().is_some_and(|g| g.is_active()))
                .filter(|(id, _)| plan.seqs.iter().any(|s| s.id == **id && s.sample))
                .filter_map(|(_, a)| a.grammar.as_mut())
                .collect();
            if !constrained.is_empty() {
                scope.spawn(move || constrained.into_iter().for_each(|g| g.compute_mask()));
            }
            model.forward(&batch)
        })?;
        let sampled = self.sample(&plan, &logits);
        let events = self.sched.commit(&plan, &sampled);
        let out = self.output(events, logits.timing.as_ref());
        self.update_metrics();
        for event in &out {
            if let OutputEvent::Finished { timing, .. } = event {
                self.metrics.observe_e2e(timing.ttft_s + timing.decode_s);
            }
        }
        Ok(out)
    }

    /// Cancels a request; returns its final event, or `None` if it was not unfinished.
    pub fn cancel(&mut self, id: RequestId) -> Option<OutputEvent> {
        let usage = self.sched.finish(id, crate::sched::FinishReason::Cancelled)?;
        self.prompt_logits.remove(&id);
        self.prompt_logprobs.remove(&id);
        self.update_metrics();
        let active = self.requests.remove(&id)?;
        Some(active.finished(id, crate::sched::FinishReason::Cancelled, usage, String::new()))
    }

    pub fn has_unfinished(&self) -> bool {
        self.sched.has_unfinished()
    }

    /// The step's inputs, laid out for the kernels.
    fn prepare(&mut self, plan: &StepPlan) -> ForwardBatch {
        let sched = &self.sched;
        let slots = self.stage_slots.assign(plan, |id| sched.is_running(id));
        let chunks: Vec<SeqChunk<'_>> = plan
            .seqs
            .iter()
            .zip(slots)
            .map(|(s, stage_slot)| SeqChunk {
                tokens: &s.tokens,
                start_pos: s.start_pos,
                block_tables: &s.block_tables,
                slot_mapping: Some(&s.slot_mapping),
                logits: match logit_rows(s) {
                    rows if rows.is_empty() => LogitsWanted::None,
                    rows => LogitsWanted::Range(rows),
                },
                stage_slot,
                states: StateWork {
                    restore_from: s.restore_state.map(|slot| self.model.snapshot_slot(slot)),
                    snapshot: s.snapshot.map(|(slot, n)| (self.model.snapshot_slot(slot), n)),
                },
            })
            .collect();
        let mut batch =
            ForwardBatch::new(&chunks, self.resolved.block_size, self.model.query_tile());
        // Where every logit row is a greedy sample, a random one the GPU can draw, or a prompt
        // position that wants only its next token's log-probability, the GPU picks the tokens
        // and reduces the rows: only ids (4 bytes a row) and log-probabilities (4 more) come
        // back, not the logits.
        let mut targets = false;
        let reducible = plan.seqs.iter().all(|s| {
            let active = self.requests.get(&s.id);
            let picked_on_gpu = active.is_some_and(|a| a.picks_on_gpu(self.gpu_sampling));
            let by_target = active.is_some_and(|a| a.prompt_targets.is_some());
            targets |= by_target && !s.prompt_logits.is_empty();
            logit_rows(s).is_empty()
                || ((!s.sample || picked_on_gpu) && (s.prompt_logits.is_empty() || by_target))
        });
        if reducible && targets {
            batch.readback = LogitReadback::TargetLogprobs;
            batch.logit_targets = self.logit_targets(plan, &batch);
        } else if reducible {
            batch.readback = LogitReadback::Argmax;
        }
        // Random draws on the GPU, whatever the step reads back (so a request's tokens do not
        // depend on what it is batched with): each draw taken from its sequence's RNG now.
        let on_gpu = self.gpu_sampling;
        let draws = plan
            .seqs
            .iter()
            .any(|s| s.sample && self.requests.get(&s.id).is_some_and(|a| a.draws_on_gpu(on_gpu)));
        if draws {
            batch.logit_sampling = self.logit_sampling(plan, &batch);
        }
        // Bias and penalties as logit edits, for the requests whose token the GPU picks.
        let edits = plan
            .seqs
            .iter()
            .any(|s| s.sample && self.requests.get(&s.id).is_some_and(|a| a.edits_on_gpu(on_gpu)));
        if edits {
            batch.logit_edits = self.logit_edits(plan, &batch);
        }
        batch
    }

    /// The logit edits of the requests shaped on the GPU ([`Active::edits_on_gpu`]), at their
    /// chunk's last row.
    fn logit_edits(&self, plan: &StepPlan, batch: &ForwardBatch) -> Vec<LogitEdit> {
        let mut out = Vec::new();
        let vocab = self.model.config().vocab_size;
        let mut row = 0;
        while row < batch.logit_chunks.len() {
            let s = &plan.seqs[batch.logit_chunks[row]];
            let rows = logit_rows(s);
            let last = row + rows.len() - 1;
            if rows.end == s.tokens.len() && s.sample {
                if let Some(a) =
                    self.requests.get(&s.id).filter(|a| a.edits_on_gpu(self.gpu_sampling))
                {
                    a.sampler.gpu_edits(last as u32, vocab, &mut out);
                }
            }
            row += rows.len();
        }
        out
    }

    /// Each logit row's sampling on the GPU: the draw of a request that samples there
    /// ([`Active::draws_on_gpu`]) at its chunk's last row, the argmax elsewhere.
    fn logit_sampling(&mut self, plan: &StepPlan, batch: &ForwardBatch) -> Vec<RowSampling> {
        let mut out = Vec::with_capacity(batch.logit_chunks.len());
        let mut row = 0;
        let on_gpu = self.gpu_sampling;
        while row < batch.logit_chunks.len() {
            let s = &plan.seqs[batch.logit_chunks[row]];
            let draws = |a: &&mut Active| s.sample && a.draws_on_gpu(on_gpu);
            let mut active = self.requests.get_mut(&s.id).filter(draws);
            for r in logit_rows(s) {
                let last = r + 1 == s.tokens.len();
                let drawn = active.as_mut().filter(|_| last).and_then(|a| a.sampler.gpu_row());
                out.push(drawn.unwrap_or(RowSampling::GREEDY));
                row += 1;
            }
        }
        out
    }

    /// Each logit row's target token: the next prompt token of a prompt-logprobs request's
    /// prompt position, `NO_TARGET` for others (and past the prompt).
    fn logit_targets(&self, plan: &StepPlan, batch: &ForwardBatch) -> Vec<u32> {
        let mut out = Vec::with_capacity(batch.logit_chunks.len());
        let mut row = 0;
        while row < batch.logit_chunks.len() {
            let s = &plan.seqs[batch.logit_chunks[row]];
            let prompt = self.requests.get(&s.id).and_then(|a| a.prompt_targets.as_ref());
            for r in logit_rows(s) {
                let next = s.start_pos + r + 1;
                let target = match prompt {
                    Some(p) if s.prompt_logits.contains(&r) && next < p.len() => p[next],
                    _ => crate::kernels::logprob::NO_TARGET,
                };
                out.push(target);
                row += 1;
            }
        }
        out
    }

    /// Samples one token for each chunk that samples, by its request's own sampler, from its
    /// last row; keeps the rows a request asked for as prompt logits.
    fn sample(&mut self, plan: &StepPlan, logits: &Logits) -> Vec<(RequestId, u32)> {
        let mut sampled = Vec::new();
        let mut row = 0;
        while row < logits.num_rows() {
            let s = &plan.seqs[logits.chunks[row]];
            for r in logit_rows(s) {
                if s.prompt_logits.contains(&r) {
                    let prompt = self.requests.get(&s.id).and_then(|a| a.prompt_targets.as_ref());
                    match (prompt, &logits.target_logprobs) {
                        // reduced on the GPU (prepare asked for it)
                        (Some(_), Some(lps)) => {
                            self.prompt_logprobs.entry(s.id).or_default().push(lps[row])
                        }
                        // a step that read the rows back: the same value from the row
                        (Some(p), None) => {
                            let next = s.start_pos + r + 1;
                            let lp = p.get(next).map_or(f32::NAN, |&t| {
                                crate::sample::token_logprobs(logits.row(row), t, 0).logprob
                            });
                            self.prompt_logprobs.entry(s.id).or_default().push(lp)
                        }
                        (None, _) => {
                            let active = self.requests.get_mut(&s.id);
                            match active.and_then(|a| a.prompt_logprobs.as_mut()) {
                                // reduced now: the prompt's next token, its rank, alternatives
                                Some(p) => {
                                    if let Some(&t) = p.prompt.get(s.start_pos + r + 1) {
                                        let row = logits.row(row);
                                        let lp = crate::sample::token_logprobs(row, t, p.k);
                                        p.entries.push((lp, crate::sample::token_rank(row, t)));
                                    }
                                }
                                None => {
                                    let kept = self.prompt_logits.entry(s.id).or_default();
                                    kept.push(logits.row(row).to_vec());
                                }
                            }
                        }
                    }
                }
                if s.sample && r + 1 == s.tokens.len() {
                    let active = self.requests.get_mut(&s.id).expect("sampled request is active");
                    let g = self.gpu_sampling;
                    let on_gpu =
                        logits.data.is_empty() || active.draws_on_gpu(g) || active.edits_on_gpu(g);
                    let token = match (&logits.token_ids, &mut active.grammar) {
                        // the GPU's argmax, the greedy sampler's choice, or its random draw
                        // (prepare asked for them only where no grammar applies yet)
                        (Some(ids), grammar) if on_gpu => {
                            if let Some(g) = grammar {
                                g.consume(ids[row]);
                            }
                            active.sampler.accept(ids[row]);
                            ids[row]
                        }
                        (_, Some(grammar)) => {
                            self.masked.clear();
                            self.masked.extend_from_slice(logits.row(row));
                            grammar.apply(&mut self.masked);
                            let token = active.sampler.sample(&self.masked);
                            grammar.consume(token);
                            token
                        }
                        (_, None) => active.sampler.sample(logits.row(row)),
                    };
                    if let Some(k) = active.logprobs {
                        let lp = crate::sample::token_logprobs(logits.row(row), token, k);
                        active.sampled_logprobs = Some(Box::new(lp));
                    }
                    sampled.push((s.id, token));
                }
                row += 1;
            }
        }
        sampled
    }

    /// Most blocks the running sequences held at once per KV-cache group since the last call
    /// (measured each step once its blocks are reserved, before windows slide), and starts
    /// over.
    pub fn take_peak_kv_blocks(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.peak_kv_blocks)
    }

    /// The prompt logits computed so far for request `id`
    /// ([`CompletionRequest::prompt_logits_from`]), one row per position in order, and forgets
    /// them. Empty for a request that asked for none.
    pub fn take_prompt_logits(&mut self, id: RequestId) -> Vec<Vec<f32>> {
        self.prompt_logits.remove(&id).unwrap_or_default()
    }

    /// The prompt next-token log-probabilities computed so far for request `id`
    /// ([`CompletionRequest::prompt_logprobs_only`]), one per position from
    /// `prompt_logits_from` in order (NaN for the last prompt position, which has no next
    /// prompt token), and forgets them.
    pub fn take_prompt_logprobs(&mut self, id: RequestId) -> Vec<f32> {
        self.prompt_logprobs.remove(&id).unwrap_or_default()
    }

    /// Detokenizes, finds stop strings, records timings; the scheduler's events become the
    /// caller's.
    fn output(
        &mut self,
        events: Vec<crate::sched::TokenEvent>,
        timing: Option<&crate::model::StepTiming>,
    ) -> Vec<OutputEvent> {
        let now = Instant::now();
        let mut out = Vec::new();
        for active in self.requests.values_mut() {
            active.add_step_timing(timing);
        }
        for event in events {
            match event {
                crate::sched::TokenEvent::Token { id, token } => {
                    let Some(active) = self.requests.get_mut(&id) else { continue };
                    if let Some(p) = active.prompt_logprobs.take() {
                        out.push(OutputEvent::PromptLogprobs { id, logprobs: p.entries });
                    }
                    let (delta, end) =
                        active.push(self.frontend.tokenizer(), token, now, &self.metrics);
                    let logprobs = active.sampled_logprobs.take();
                    out.push(OutputEvent::Delta { id, text: delta, token, logprobs });
                    if let Some(reason) = end {
                        if let Some(usage) = self.sched.finish(id, reason) {
                            let active = self.requests.remove(&id).expect("active");
                            out.push(active.finished(id, reason, usage, String::new()));
                        }
                    }
                }
                crate::sched::TokenEvent::Finished { id, reason, usage } => {
                    let Some(mut active) = self.requests.remove(&id) else { continue };
                    let rest = active.flush(self.frontend.tokenizer());
                    let reason = active.decided().unwrap_or(reason);
                    out.push(active.finished(id, reason, usage, rest));
                }
            }
        }
        out
    }

    /// The gauges and counters from the scheduler now (and per tenant, if any are tracked).
    fn update_metrics(&self) {
        self.metrics.update_from(&self.sched.stats());
        if let Some(disk) = &self.disk {
            self.metrics.update_disk(disk.len(), &disk.stats);
        }
        if !self.tenants.is_empty() {
            for t in self.sched.tenant_stats() {
                if let Some(name) = self.tenants.get(&t.kv.namespace) {
                    self.metrics.update_tenant(name, &t);
                }
            }
        }
    }

    /// Adds the engine's numbers to a scheduler refusal.
    fn explain(&self, e: SchedError) -> EngineError {
        match e {
            SchedError::PromptTooLong { prompt_len, max_model_len, .. } => EngineError::Config(format!(
                "the prompt has {prompt_len} tokens but the context is {max_model_len} tokens \
                 (-c/--max-model-len); shorten the prompt or raise -c (this model supports up to {})",
                self.model_max_len
            )),
            other => EngineError::Sched(other),
        }
    }

    pub fn gpu(&self) -> &Arc<Gpu> {
        &self.gpu
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut Model {
        &mut self.model
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        self.frontend.tokenizer()
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.frontend.chat_template()
    }

    /// Prompts to token ids: shareable with other threads.
    pub fn frontend(&self) -> &Arc<Frontend> {
        &self.frontend
    }

    /// Queues a request stated as a prompt (chat messages, text or ids).
    pub fn add_prompt(&mut self, req: PromptRequest) -> Result<RequestId, EngineError> {
        let req = self.frontend.request(req)?;
        self.add_request(req)
    }

    pub fn config(&self) -> &ResolvedConfig {
        &self.resolved
    }

    pub fn kv_layout(&self) -> &KvLayout {
        &self.layout
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Reads the blocks the waiting prompts would take from the disk tier into the host tier
    /// (checked; a damaged file is recomputed), so that their admission hits them there.
    fn fetch_from_disk(&mut self) -> Result<(), EngineError> {
        let (Some(disk), Some(host)) = (&mut self.disk, &mut self.host_kv) else { return Ok(()) };
        if disk.len() == 0 {
            return Ok(());
        }
        let mut wanted = Vec::new();
        // the prompts admission may reach this step: a step admits at most max_num_seqs
        let next = self.sched.waiting_prompts().into_iter().take(self.resolved.max_num_seqs);
        for (namespace, tokens) in next {
            let (keys, held) = self.sched.kv().tier_keys(namespace, tokens);
            wanted.extend(keys[held..].iter().take_while(|k| disk.contains(k)).copied());
            if wanted.len() >= MAX_DISK_FETCH_PER_STEP {
                break;
            }
        }
        wanted.truncate(MAX_DISK_FETCH_PER_STEP);
        for key in wanted {
            let Some(bytes) = disk.read(&key) else { continue };
            let Some(slot) = self.sched.admit_to_host(key) else { continue };
            // what the host tier dropped for it goes to disk before its slot is filled
            host.apply(&self.model, &self.sched.take_kv_moves(), Some(disk))?;
            host.fill(slot, &bytes);
        }
        Ok(())
    }

    /// Writes the host tier's blocks and the pool's cached blocks to the disk tier (done when
    /// the engine is dropped); returns how many were not there yet. A no-op without one.
    pub fn persist_kv_cache(&mut self) -> Result<usize, EngineError> {
        let (Some(disk), Some(host)) = (&mut self.disk, &self.host_kv) else { return Ok(0) };
        let before = disk.stats.written;
        let kv = self.sched.kv();
        for (key, slot) in kv.host_tier().map(|h| h.entries_by_age()).unwrap_or_default() {
            if let Some(bytes) = host.bytes(slot) {
                disk.write(key, bytes);
            }
        }
        let cached: Vec<_> =
            kv.cached_block_keys().into_iter().filter(|(_, k)| !disk.contains(k)).collect();
        let bb = self.model.kv_block_bytes() as usize;
        for chunk in cached.chunks(64) {
            let blocks: Vec<u32> = chunk.iter().map(|&(b, _)| b).collect();
            let bytes = self.model.read_kv_blocks(&blocks)?;
            for ((_, key), payload) in chunk.iter().zip(bytes.chunks_exact(bb)) {
                disk.write(*key, payload);
            }
        }
        Ok((disk.stats.written - before) as usize)
    }

    /// The disk tier's counters (`--kv-cache-dir`), if there is one.
    pub fn disk_tier_stats(&self) -> Option<DiskTierStats> {
        self.disk.as_ref().map(|d| d.stats)
    }

    /// Evicts every cached block no request uses (cold-cache comparisons).
    pub fn reset_prefix_cache(&mut self) -> usize {
        self.sched.reset_prefix_cache()
    }

    /// The Prometheus metrics, updated after every step.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }
}

/// Rows of a planned chunk that get logits (chunk-relative): its prompt-logit rows, through
/// the last row when it samples; empty for none. A range, so a chunk's rows are contiguous.
fn logit_rows(s: &crate::sched::ScheduledSeq) -> std::ops::Range<usize> {
    let q_len = s.tokens.len();
    match (s.sample, s.prompt_logits.is_empty()) {
        (false, _) => s.prompt_logits.clone(),
        (true, true) => q_len - 1..q_len,
        (true, false) => s.prompt_logits.start..q_len,
    }
}

/// Tracks the configured tenants in the scheduler with their quotas in blocks (a fraction is
/// of the pool plus the recurrent-state slots, `KvManager::quota_capacity`); returns their
/// names by namespace. The error names the tenant and the flag.
fn set_tenants(
    sched: &mut Scheduler,
    cfg: &EngineConfig,
    layout: &KvLayout,
) -> Result<HashMap<u64, String>, EngineError> {
    let mut names = HashMap::new();
    let capacity = sched.kv().quota_capacity();
    for t in &cfg.tenants {
        let ns = tenant_namespace(&t.name);
        let quota = t.kv_quota.map(|q| q.blocks(capacity, layout.bytes_per_block()));
        sched
            .set_tenant(ns, quota)
            .map_err(|e| EngineError::Config(format!("--tenant-kv-quota {}: {e}", t.name)))?;
        names.insert(ns, t.name.clone());
    }
    Ok(names)
}

/// Model buffer sizes for a resolved configuration.
fn model_options(r: &ResolvedConfig) -> ModelOptions {
    ModelOptions {
        max_num_batched_tokens: r.max_num_batched_tokens,
        max_num_seqs: r.max_num_seqs,
        max_logit_rows: r.max_logit_rows,
        max_model_len: r.max_model_len,
        block_size: r.block_size,
        num_blocks: r.num_blocks,
        kv_cache: r.kv_cache,
        kv_groups: r.kv_groups.clone(),
        state_snapshots: r.state_snapshots,
    }
}

/// The model path to use when none is given: `$KVRUN_MODEL`, else the one `scripts/` fetches.
pub fn default_model_path() -> std::path::PathBuf {
    if let Ok(p) = std::env::var("KVRUN_MODEL") {
        return p.into();
    }
    let rel = Path::new("assets/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if rel.exists() {
        return rel.to_path_buf();
    }
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}
