//! Engine configuration: what the user asks for ([`EngineConfig`]) and what it resolves to on
//! this model and device ([`ResolvedConfig`]), computed once and never mutated downstream.

use std::path::PathBuf;

use crate::gpu::GpuOptions;
use crate::kv::{
    format_bytes, GroupKind, HeadBlockStorage, KvGroups, KvLayout, KvStorage, PlannedContext,
};
use crate::loader::ModelConfig;
use crate::quant::{head_block_words, KvCacheSpec, KvQuant, KvQuantError};

use super::EngineError;

/// What the user asks for. `None` fields take the defaults documented on each field.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// A `.gguf` file or an HF directory.
    pub model: PathBuf,
    pub gpu: GpuOptions,
    /// Tokens per KV block (`--block-size`, default 16).
    pub block_size: usize,
    /// KV budget in bytes (`--kv-cache-memory`); default: `max_num_seqs` sequences of
    /// `max_model_len` tokens.
    pub kv_cache_memory: Option<u64>,
    /// Size the KV pool from the adapter's memory instead (`--gpu-memory-utilization`, vLLM's
    /// name): it gets this fraction of the device budget less the weights, activations,
    /// staging and states (`check_device_memory` names the budget's source). Excludes
    /// `kv_cache_memory`.
    pub gpu_memory_utilization: Option<f64>,
    /// The fraction used when neither `kv_cache_memory` nor `gpu_memory_utilization` is given
    /// and the adapter is a GPU ([`EngineConfig::utilization_on`]); `kvrun serve` sets 0.9
    /// (vLLM's default). CPU adapters keep the default pool: their budget is the host's memory.
    pub gpu_memory_utilization_default: Option<f64>,
    /// Host RAM for KV blocks the pool evicts (`--kv-offloading-size`, vLLM's name): a prefix
    /// that comes back is copied in instead of recomputed. Needs the prefix cache and a model
    /// of one full-attention KV-cache group. Default: none.
    pub kv_offloading_size: Option<u64>,
    /// A folder that keeps KV blocks across restarts (`--kv-cache-dir`): what the host tier
    /// drops, and at shutdown the cached blocks, are written there; a prompt that continues
    /// into them reads them back instead of computing. Brings a host tier of
    /// `min(kv_cache_dir_size, 1 GiB)` when `kv_offloading_size` is not given.
    pub kv_cache_dir: Option<PathBuf>,
    /// Most bytes `kv_cache_dir` holds (`--kv-cache-dir-size`, default 4 GiB).
    pub kv_cache_dir_size: Option<u64>,
    /// Context length per sequence (`-c`); default: the model's, capped at 8192.
    pub max_model_len: Option<usize>,
    /// Most sequences per step (`--max-num-seqs`, default 1 for one-shot commands).
    pub max_num_seqs: usize,
    /// Most tokens per step: the prefill chunk size (default 512).
    pub max_num_batched_tokens: usize,
    /// Most logit rows per step (default `max_num_seqs`; perplexity asks for more).
    pub max_logit_rows: Option<usize>,
    /// KV storage format, scales and rotation (`--kv-cache-dtype`, `--kv-k-scale`,
    /// `--kv-v-scale`, `--kv-rotate`; default f16, unrotated).
    pub kv_cache: KvCacheSpec,
    /// Reuse full KV blocks of earlier requests with the same prefix (`--no-prefix-cache` off).
    pub enable_prefix_cache: bool,
    /// A chat template to use instead of the model's (`--chat-template-file`, llama-server's
    /// flag): a Jinja file.
    pub chat_template_file: Option<PathBuf>,
    /// Recurrent models (Qwen3.5): state slots for prefix-cache snapshots
    /// (`--state-snapshots`); default [`DEFAULT_STATE_SNAPSHOTS_PER_SEQ`] × `max_num_seqs`,
    /// fewer where a layer's buffer would outgrow a binding. 0 turns prefix reuse off for them.
    pub state_snapshots: Option<usize>,
    /// Tenants to track (per-tenant metrics) and their KV quotas (`--tenant-kv-quota`).
    pub tenants: Vec<TenantConfig>,
    /// Kernel variants: from the device (default), or forced (tests run the GPU family end to
    /// end on CPU adapters).
    pub kernel_family: crate::kernels::KernelFamily,
}

/// A tenant: its name (its prefix-cache namespace is [`tenant_namespace`] of it) and its cap on
/// KV blocks held, running and cached.
#[derive(Clone, Debug, PartialEq)]
pub struct TenantConfig {
    pub name: String,
    pub kv_quota: Option<KvQuota>,
}

/// A tenant's KV cap: a fraction of the pool, or bytes (whole blocks, rounded down).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KvQuota {
    Fraction(f64),
    Bytes(u64),
}

impl KvQuota {
    /// The cap in blocks of `bytes_per_block`, of a pool of `num_blocks` (for a recurrent
    /// model, its state slots included as blocks' worth of bytes).
    pub fn blocks(self, num_blocks: usize, bytes_per_block: u64) -> usize {
        match self {
            KvQuota::Fraction(f) => (f * num_blocks as f64).floor() as usize,
            KvQuota::Bytes(b) => usize::try_from(b / bytes_per_block.max(1)).unwrap_or(usize::MAX),
        }
    }
}

/// The prefix-cache namespace of a tenant: the first 8 bytes of the SHA-256 of its name.
pub fn tenant_namespace(tenant: &str) -> u64 {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(tenant.as_bytes());
    u64::from_le_bytes(digest[..8].try_into().expect("8 bytes"))
}

impl EngineConfig {
    /// The fraction of the device's memory that sizes the KV pool on an adapter that `is_cpu`
    /// or not: the one given, else the default on a GPU when no pool size is given.
    pub fn utilization_on(&self, is_cpu: bool) -> Option<f64> {
        let defaulted = self.kv_cache_memory.is_none() && !is_cpu;
        self.gpu_memory_utilization.or(self.gpu_memory_utilization_default.filter(|_| defaulted))
    }

    /// Defaults for `model`.
    pub fn new(model: impl Into<PathBuf>) -> Self {
        EngineConfig {
            model: model.into(),
            gpu: GpuOptions::default(),
            block_size: 16,
            kv_cache_memory: None,
            gpu_memory_utilization: None,
            gpu_memory_utilization_default: None,
            kv_offloading_size: None,
            kv_cache_dir: None,
            kv_cache_dir_size: None,
            max_model_len: None,
            max_num_seqs: 1,
            max_num_batched_tokens: 512,
            max_logit_rows: None,
            kv_cache: KvCacheSpec::default(),
            enable_prefix_cache: true,
            state_snapshots: None,
            chat_template_file: None,
            tenants: Vec::new(),
            kernel_family: Default::default(),
        }
    }
}

/// What the KV formats of `spec` cost per head block of `block_size` tokens × `head_dim`
/// channels, as [`KvLayout`] needs it (kv/ knows no formats). Checks `head_dim` against the
/// spec (whole words per token; a power of two to rotate). O(1).
///
/// Staging: the GPU pool stages the partial last block of every running sequence in f16 for
/// *every* quantized format, not only the granularities that need it
/// ([`crate::quant::needs_staging`]): a block is then quantized once, whole, by one writer (no
/// read-modify-write of scale words two tokens share), its bits depend only on its f16 rows
/// (prefill, decode, prefix reuse and preemption agree), and the attention kernels read a
/// query's own block in f16 whatever the granularity. So `staged` is true for K and V of every
/// quantized format.
pub fn kv_storage(
    spec: &KvCacheSpec,
    block_size: usize,
    head_dim: usize,
) -> Result<KvStorage, KvQuantError> {
    spec.check_head_dim(head_dim)?;
    let head_block = |q: KvQuant| HeadBlockStorage {
        bytes: head_block_words(q, block_size, head_dim).bytes(),
        staged: q.format.is_quantized(),
        scale_name: q.scale_name(),
    };
    Ok(KvStorage { dtype_name: spec.format().name(), k: head_block(spec.k), v: head_block(spec.v) })
}

/// The KV layout of `model` in `groups`' layer slots: a block holds, in each slot, the widest
/// head shape's KV heads (`quant::pool_heads`; one shape for every model but Gemma 4, whose
/// global layers then use part of their slot's block), so `bytes_per_block` counts those
/// padded slots. `kvrun plan` and the engine both size the pool with it.
pub fn model_kv_layout(
    spec: &KvCacheSpec,
    block_size: usize,
    model: &ModelConfig,
    groups: &KvGroups,
) -> Result<KvLayout, EngineError> {
    if !(1..=crate::kv::MAX_BLOCK_SIZE).contains(&block_size) {
        return Err(crate::kv::KvError::BlockSize { block_size }.into());
    }
    let storage = model_kv_storage(spec, block_size, model)?;
    for (_, head_dim) in model.head_shapes() {
        spec.check_head_dim(head_dim)?;
    }
    let room =
        crate::quant::pool_heads(spec, block_size, &model.head_shapes(), model.values_in_keys())?;
    let layout =
        KvLayout::new(groups.slots_per_block(), room[0], model.head_dim, block_size, storage)?;
    Ok(layout)
}

/// [`kv_storage`] for `model`'s KV cache. MLA's latent keeps its values inside its keys
/// ([`KvStorage::values_in_keys`]: a V head block of 0 bytes), quantized with one granularity
/// for both (the row is read as keys and as values), never rotated. Its f16 staging still has a
/// K and a V half (`kv_stage` copies the row into both), so V stays `staged` like K.
pub fn model_kv_storage(
    spec: &KvCacheSpec,
    block_size: usize,
    model: &ModelConfig,
) -> Result<KvStorage, EngineError> {
    let storage = kv_storage(spec, block_size, model.head_dim)?;
    if !model.values_in_keys() {
        return Ok(storage);
    }
    if spec.rotate {
        return Err(EngineError::Config(
            "this model caches an MLA latent, which --kv-rotate does not support; drop \
             --kv-rotate"
                .into(),
        ));
    }
    if spec.k != spec.v {
        return Err(EngineError::Config(format!(
            "this model caches an MLA latent, one row read as keys and as values, so K and V \
             need the same scales; add --kv-k-scale {g} --kv-v-scale {g} (or per-channel for \
             both)",
            g = spec.v.scale_name()
        )));
    }
    Ok(storage.values_in_keys())
}

/// The configuration after looking at the model: every number concrete.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ResolvedConfig {
    pub block_size: usize,
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_logit_rows: usize,
    pub kv_cache_memory: u64,
    pub num_blocks: usize,
    pub kv_cache: KvCacheSpec,
    /// `bytes_per_block / block_size` (display only; budgets count whole blocks).
    pub kv_bytes_per_token: f64,
    /// The model's KV-cache groups (one block table each per sequence).
    pub kv_groups: KvGroups,
    /// Prefix caching as asked, and possible for these groups.
    pub enable_prefix_cache: bool,
    /// Recurrent models with the prefix cache: state snapshot slots (each one sequence's
    /// states, `ModelConfig::state_bytes_per_sequence`); 0 otherwise.
    pub state_snapshots: usize,
    /// Recurrent models: one sequence's states (a running slot or a snapshot slot); 0 for
    /// attention-only models.
    pub state_bytes_per_sequence: u64,
}

impl ResolvedConfig {
    /// Bytes of the recurrent-state pool: `max_num_seqs` running slots and the snapshot slots,
    /// outside `kv_cache_memory`; 0 for attention-only models.
    pub fn state_pool_bytes(&self) -> u64 {
        let slots = (self.max_num_seqs + self.state_snapshots) as u64;
        self.state_bytes_per_sequence.saturating_mul(slots)
    }
}

impl ResolvedConfig {
    /// The second look at the KV-cache groups, once the adapter is open: the fewest slots a
    /// block holds bound the largest pool (one K and one V buffer a slot, each binding at most
    /// `max_binding` bytes: `kv/groups.rs`). When a pool of `pool_bytes` does not bind in the
    /// groups chosen for padding alone, they are chosen again with at least the slots it needs
    /// ([`slots_for_pool`]), said in one line. A pool no grouping binds gets the most slots
    /// (a sequence then holds the fewest blocks, and the binding limits blocks, not bytes);
    /// the pool is then capped to what binds, or refused naming the largest budget
    /// (`ModelError::KvPoolTooLarge`).
    pub fn fit_slots_to_binding(
        self,
        layout: KvLayout,
        cfg: &EngineConfig,
        model: &ModelConfig,
        pool_bytes: u64,
        max_binding: u64,
    ) -> Result<(Self, KvLayout), EngineError> {
        let slots = self.kv_groups.slots_per_block();
        let max_blocks =
            crate::model::max_kv_pool_blocks(model, &super::model_options(&self), max_binding)?;
        let slot_block_bytes = layout.bytes_per_block() / slots.max(1) as u64;
        let need = slots_for_pool(pool_bytes, max_blocks, slot_block_bytes);
        if need <= slots {
            return Ok((self, layout));
        }
        let (again, again_layout) = ResolvedConfig::resolve_with_slots(cfg, model, need)?;
        let more = again.kv_groups.slots_per_block();
        if more == slots {
            return Ok((self, layout));
        }
        tracing::info!(
            "KV blocks hold {more} layer slots, not {slots}: a pool of {} binds on this adapter \
             only in slot buffers of at most {max_binding} bytes ({} groups, {} padding slots)",
            format_bytes(pool_bytes),
            again.kv_groups.len(),
            again.kv_groups.num_padding_slots()
        );
        Ok((again, again_layout))
    }
}

/// Default state snapshot slots per `--max-num-seqs` sequence: room for a conversation's
/// newest two (the end of its last prompt and of its last reply).
pub const DEFAULT_STATE_SNAPSHOTS_PER_SEQ: usize = 2;

/// The KV-cache groups of `model`'s layers ([`KvGroups::from_packed_layers_at`]) for
/// sequences of up to `planned.max_model_len` tokens: a window that covers the whole context is
/// full attention (and keeps the prefix cache available); padding slots are weighed by the
/// blocks their group holds at that context. Blocks hold at least `min_slots` layer slots
/// ([`slots_for_pool`]; 1 when no pool is planned yet).
pub fn kv_groups_at(model: &ModelConfig, planned: PlannedContext, min_slots: usize) -> KvGroups {
    let kinds: Vec<Option<GroupKind>> = model
        .layers
        .iter()
        .map(|layer| crate::model::layer_group_kind(layer.attention, planned.max_model_len))
        .collect();
    let per = crate::model::layers_per_slot(model);
    KvGroups::from_packed_layers_at(&kinds, &per, Some(planned), min_slots)
}

/// The fewest layer slots a block may hold for a pool of `pool_bytes` to bind: every slot is
/// one K and one V buffer of at most `max_blocks` blocks (`model::max_kv_pool_blocks`, the
/// adapter's binding limit over a slot's bytes per block), `slot_block_bytes` (K and V) each,
/// so a pool of `s` slots holds at most `s × max_blocks × slot_block_bytes` bytes.
pub fn slots_for_pool(pool_bytes: u64, max_blocks: usize, slot_block_bytes: u64) -> usize {
    let per_slot = (max_blocks as u128 * slot_block_bytes as u128).max(1);
    usize::try_from((pool_bytes as u128).div_ceil(per_slot)).unwrap_or(usize::MAX).max(1)
}

/// [`kv_groups_at`] with the default block size and step budget (`EngineConfig::new`'s).
pub fn kv_groups(model: &ModelConfig, max_model_len: usize) -> KvGroups {
    let d = EngineConfig::new(std::path::PathBuf::new());
    let planned = PlannedContext {
        max_model_len,
        block_size: d.block_size,
        step_tokens: d.max_num_batched_tokens,
    };
    kv_groups_at(model, planned, 1)
}

/// Context length used when the model declares a larger one and the user gave none.
pub const DEFAULT_MAX_MODEL_LEN_CAP: usize = 8192;

impl ResolvedConfig {
    /// The one setting the device decides, once it is open: the logit rows a step may have are
    /// capped at what one storage binding holds (`max_binding_bytes / (vocab × 4)`; Gemma 3's
    /// 262,144-token vocabulary fits 128 rows in 128 MiB), never below `max_num_seqs` (one row a
    /// sampling sequence: that is the model's own limit, refused at load naming the flags).
    /// Scoring requests (perplexity, prompt logits) then take more steps, not more memory: the
    /// scheduler cuts their chunks to the rows left ([`crate::sched::SchedulerConfig`]).
    pub fn fit_logit_rows(&mut self, vocab_size: usize, max_binding_bytes: u64) {
        let row_bytes = (vocab_size as u64).saturating_mul(4).max(1);
        let fit = usize::try_from(max_binding_bytes / row_bytes).unwrap_or(usize::MAX);
        if fit < self.max_logit_rows {
            tracing::info!(
                "{} logit rows of {vocab_size} floats do not fit one buffer binding of \
                 {max_binding_bytes} bytes; steps take at most {}",
                self.max_logit_rows,
                fit.max(self.max_num_seqs)
            );
            self.max_logit_rows = fit.max(self.max_num_seqs);
        }
    }

    /// The state snapshots left at their default are cut to what one storage binding holds
    /// next to the running slots (a recurrent layer's state buffer holds `max_num_seqs +
    /// state_snapshots` slots of `slot_bytes`); a number given by flag is checked at load,
    /// where a too-large one is refused naming the flag.
    pub fn fit_state_snapshots(&mut self, cfg: &EngineConfig, slot_bytes: u64, max_binding: u64) {
        if cfg.state_snapshots.is_some() || slot_bytes == 0 {
            return;
        }
        let fit = usize::try_from(max_binding / slot_bytes).unwrap_or(usize::MAX);
        let fit = fit.saturating_sub(self.max_num_seqs);
        if fit < self.state_snapshots {
            tracing::info!(
                "{} state snapshots do not fit one buffer binding of {max_binding} bytes; \
                 keeping {fit}",
                self.state_snapshots
            );
            self.state_snapshots = fit;
        }
    }

    /// Resolves `cfg` against the model. Refuses a budget that holds no block, or less than
    /// one sequence of `max_model_len` tokens (the fix is named in the error).
    pub fn resolve(
        cfg: &EngineConfig,
        model: &ModelConfig,
    ) -> Result<(Self, KvLayout), EngineError> {
        Self::resolve_with_slots(cfg, model, 1)
    }

    /// [`ResolvedConfig::resolve`] with blocks of at least `min_slots` layer slots (the
    /// engine's second pass when the adapter cannot bind the pool in fewer: [`slots_for_pool`]).
    pub fn resolve_with_slots(
        cfg: &EngineConfig,
        model: &ModelConfig,
        min_slots: usize,
    ) -> Result<(Self, KvLayout), EngineError> {
        let model_max = model.max_position_embeddings.max(1);
        let max_model_len = match cfg.max_model_len {
            Some(0) => {
                return Err(EngineError::Config("-c/--max-model-len must be at least 1".into()))
            }
            Some(n) if n > model_max => {
                return Err(EngineError::Config(format!(
                    "-c {n} exceeds the model's context length of {model_max} tokens; use at most {model_max}"
                )))
            }
            Some(n) => n,
            None => model_max.min(DEFAULT_MAX_MODEL_LEN_CAP),
        };
        if cfg.max_num_seqs == 0 || cfg.max_num_batched_tokens == 0 {
            return Err(EngineError::Config(
                "--max-num-seqs and the batch token budget must be at least 1".into(),
            ));
        }
        let planned = PlannedContext {
            max_model_len,
            block_size: cfg.block_size,
            step_tokens: cfg.max_num_batched_tokens,
        };
        let kv_groups = kv_groups_at(model, planned, min_slots);
        // The prefix cache keys its nodes by a full-attention group's blocks (`kv::PrefixCache`).
        let has_full = kv_groups.groups().iter().any(|g| g.kind == GroupKind::Full);
        // A recurrent layer's state cannot be cut back to a prefix: a cached prefix is usable
        // where a state snapshot ends it (`kv/manager_snapshots.rs`), so no slots, no reuse.
        let recurrent = kv_groups.num_kv_layers() < kv_groups.num_layers();
        let state_snapshots = match recurrent {
            true => {
                cfg.state_snapshots.unwrap_or(DEFAULT_STATE_SNAPSHOTS_PER_SEQ * cfg.max_num_seqs)
            }
            false => 0,
        };
        let enable_prefix_cache =
            cfg.enable_prefix_cache && has_full && (!recurrent || state_snapshots > 0);
        let state_snapshots = if enable_prefix_cache { state_snapshots } else { 0 };
        if cfg.enable_prefix_cache && !enable_prefix_cache {
            tracing::warn!(
                "prefix caching is off: {}",
                if recurrent {
                    "this model's recurrent (linear attention) layers need state snapshots to \
                     reuse a prefix, and --state-snapshots is 0"
                } else {
                    "every layer of this model uses a sliding window shorter than the context, \
                     and the cache needs one full-attention layer"
                }
            );
        }
        let layout = model_kv_layout(&cfg.kv_cache, cfg.block_size, model, &kv_groups)?;
        let lone_blocks = kv_groups.blocks_for_lone_sequence(
            cfg.block_size,
            max_model_len,
            cfg.max_num_batched_tokens,
        );
        let per_seq = lone_blocks as u64 * layout.bytes_per_block();
        let budget = cfg.kv_cache_memory.unwrap_or(per_seq * cfg.max_num_seqs as u64);
        let num_blocks = layout.require_blocks_for_budget(budget)?;
        if (num_blocks as u64) * layout.bytes_per_block() < per_seq {
            return Err(EngineError::Config(format!(
                "--kv-cache-memory {} holds {} tokens, less than one sequence of -c {max_model_len} tokens \
                 needs ({}); raise --kv-cache-memory to at least {} or lower -c to at most {}",
                format_bytes(budget),
                num_blocks * cfg.block_size,
                format_bytes(per_seq),
                format_bytes(per_seq),
                num_blocks * cfg.block_size,
            )));
        }
        let resolved = ResolvedConfig {
            block_size: cfg.block_size,
            max_model_len,
            max_num_seqs: cfg.max_num_seqs,
            max_num_batched_tokens: cfg.max_num_batched_tokens,
            max_logit_rows: cfg.max_logit_rows.unwrap_or(cfg.max_num_seqs).max(cfg.max_num_seqs),
            kv_cache_memory: budget,
            num_blocks,
            kv_cache: cfg.kv_cache,
            kv_bytes_per_token: layout.bytes_per_token(),
            kv_groups,
            enable_prefix_cache,
            state_snapshots,
            state_bytes_per_sequence: model.state_bytes_per_sequence(),
        };
        Ok((resolved, layout))
    }
}

/// Refuses, before anything is allocated, a KV pool that with the model's weights and the
/// recurrent states exceeds what the adapter may allocate ([`crate::gpu::DeviceMemory`]),
/// naming the largest `--kv-cache-memory` that fits (activations come on top of it, so that is
/// an upper bound). Adapters whose backend gives no budget are not checked.
pub fn check_device_memory(
    cfg: &EngineConfig,
    r: &ResolvedConfig,
    memory: crate::gpu::DeviceMemory,
    weight_bytes: u64,
) -> Result<(), EngineError> {
    let Some(budget) = memory.budget_bytes else { return Ok(()) };
    let fixed = weight_bytes.saturating_add(r.state_pool_bytes());
    let need = fixed.saturating_add(r.kv_cache_memory);
    if need <= budget {
        return Ok(());
    }
    let source = match memory.source {
        crate::gpu::MemorySource::VulkanMemoryBudget => "its Vulkan memory budget",
        crate::gpu::MemorySource::VulkanHeapSize => "its device-local heap",
        crate::gpu::MemorySource::HostAvailable => "the host's available memory (a CPU adapter)",
        crate::gpu::MemorySource::Unknown => "its backend",
        crate::gpu::MemorySource::Given => "--device-memory",
    };
    let pool = format_bytes(r.kv_cache_memory);
    let asked = match cfg.kv_cache_memory {
        Some(_) => format!("--kv-cache-memory {pool}"),
        None => {
            format!("a KV cache of {pool} ({} sequences of -c {})", r.max_num_seqs, r.max_model_len)
        }
    };
    let fix = match budget.checked_sub(fixed) {
        Some(room) if room > 0 => format!(
            "give --kv-cache-memory at most {} (or lower -c / --max-num-seqs)",
            format_bytes(room)
        ),
        _ => "the weights alone do not fit: use a smaller or more quantized model".to_string(),
    };
    Err(EngineError::DeviceMemory(format!(
        "{asked} and the model's weights ({}) need {}, more than this adapter may allocate: {} \
         by {source}; {fix}",
        format_bytes(weight_bytes),
        format_bytes(need),
        format_bytes(budget),
    )))
}

/// The budget `--gpu-memory-utilization` gives the step buffers, activations and KV pool
/// ([`crate::model::Model::load_fitting`]): `utilization` × the adapter's budget less the
/// model's weights, the quantized-KV staging and the recurrent states. Refuses a fraction
/// outside (0, 1], an adapter whose backend gives no budget, and a fraction that leaves
/// nothing after the weights (naming the smallest that does).
pub fn kv_fit(
    utilization: f64,
    r: &ResolvedConfig,
    layout: &KvLayout,
    memory: crate::gpu::DeviceMemory,
    weight_bytes: u64,
) -> Result<crate::model::KvFit, EngineError> {
    if !(utilization > 0.0 && utilization <= 1.0) {
        return Err(EngineError::Config(format!(
            "--gpu-memory-utilization {utilization} is not a fraction of the adapter's memory; \
             give a number above 0 and at most 1 (e.g. 0.9)"
        )));
    }
    let Some(budget) = memory.budget_bytes else {
        return Err(EngineError::Config(
            "--gpu-memory-utilization needs the adapter's memory size, which its backend does \
             not report (`kvrun info`); give --kv-cache-memory instead"
                .into(),
        ));
    };
    let usable = (utilization * budget as f64) as u64;
    let staging = layout.staging_bytes_per_sequence().saturating_mul(r.max_num_seqs as u64);
    let fixed = weight_bytes.saturating_add(staging).saturating_add(r.state_pool_bytes());
    match usable.checked_sub(fixed).filter(|&b| b > 0) {
        Some(bytes) => Ok(crate::model::KvFit { bytes, bytes_per_block: layout.bytes_per_block() }),
        None => Err(EngineError::Config(format!(
            "--gpu-memory-utilization {utilization} gives {} of the adapter's {}, not more than \
             the model's weights, KV staging and states need ({}); raise it above {:.3}",
            format_bytes(usable),
            format_bytes(budget),
            format_bytes(fixed),
            fixed as f64 / budget as f64
        ))),
    }
}

impl ResolvedConfig {
    /// Takes the pool the model was loaded with from a budget (`num_blocks` blocks of `layout`),
    /// and checks it holds one sequence of `max_model_len`; with `-c` not given, a pool that
    /// holds less fits the context to it (llama.cpp's `--fit`, said in one line) instead.
    pub fn fit_pool(
        &mut self,
        cfg: &EngineConfig,
        num_blocks: usize,
        layout: &KvLayout,
    ) -> Result<(), EngineError> {
        self.num_blocks = num_blocks;
        self.kv_cache_memory = num_blocks as u64 * layout.bytes_per_block();
        let (bs, step) = (self.block_size, self.max_num_batched_tokens);
        let blocks = |len: usize| self.kv_groups.blocks_for_lone_sequence(bs, len, step);
        if blocks(self.max_model_len) <= num_blocks {
            return Ok(());
        }
        let pool = format_bytes(self.kv_cache_memory);
        if cfg.max_model_len.is_some() || blocks(1) > num_blocks {
            return Err(EngineError::Config(format!(
                "the KV cache --gpu-memory-utilization leaves ({pool}, {num_blocks} blocks) holds \
                 less than one sequence of -c {} tokens ({} blocks); raise \
                 --gpu-memory-utilization or lower -c",
                self.max_model_len,
                blocks(self.max_model_len)
            )));
        }
        // the longest context whose lone sequence fits (blocks grow with the length)
        let (mut lo, mut hi) = (1, self.max_model_len);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if blocks(mid) <= num_blocks {
                lo = mid;
            } else {
                hi = mid - 1;
            }
        }
        tracing::warn!(
            "-c fitted to {lo} tokens: the KV cache --gpu-memory-utilization leaves ({pool}) \
             holds no longer sequence (give -c to choose; {} asked by default)",
            self.max_model_len
        );
        self.max_model_len = lo;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loader::AttentionKind;
    use crate::quant::{KvFormat, ScaleGranularity};

    const SMOLLM2: &str = r#"{"architectures": ["LlamaForCausalLM"], "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
        "num_key_value_heads": 3, "vocab_size": 49152, "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5, "rope_theta": 100000, "tie_word_embeddings": true}"#;

    fn smol_layout(spec: &KvCacheSpec) -> KvLayout {
        KvLayout::new(30, 3, 64, 16, kv_storage(spec, 16, 64).unwrap()).unwrap()
    }

    /// SmolLM2-135M, block 16, default granularities (K per-channel, V per-token):
    /// fp8/int8 head blocks K 1024 + 128, V 1024 + 32 bytes; int4 K 512 + 256, V 512 + 64.
    /// Staging: one f16 block of K and of V per sequence for every quantized format
    /// (30 × 3 × 16 × 64 × 2 bytes × 2).
    #[test]
    fn smollm2_bytes_per_token_by_format() {
        let want = [
            (KvFormat::F16, 23_040.0, 0),
            (KvFormat::Fp8E4m3, 12_420.0, 368_640),
            (KvFormat::Fp8E5m2, 12_420.0, 368_640),
            (KvFormat::Int8, 12_420.0, 368_640),
            (KvFormat::Int4, 7_560.0, 368_640),
        ];
        for (format, per_token, staging) in want {
            let layout = smol_layout(&KvCacheSpec::new(format, None, None, false).unwrap());
            assert_eq!(layout.bytes_per_token(), per_token, "{format}");
            assert_eq!(layout.staging_bytes_per_sequence(), staging, "{format}");
            assert_eq!(layout.storage.dtype_name, format.name());
        }
        let per_tensor = Some(ScaleGranularity::PerTensor);
        let fp8 = KvCacheSpec::new(KvFormat::Fp8E4m3, per_tensor, per_tensor, false).unwrap();
        assert_eq!(smol_layout(&fp8).bytes_per_token(), 11_520.0); // half of f16, no scales
        assert_eq!(smol_layout(&fp8).staging_bytes_per_sequence(), 368_640);
    }

    #[test]
    fn kv_storage_checks_head_dim() {
        let int4 = KvCacheSpec::new(KvFormat::Int4, None, None, false).unwrap();
        assert!(kv_storage(&int4, 16, 68).unwrap_err().to_string().contains("multiple of 8"));
        let rotated = KvCacheSpec::new(KvFormat::Int8, None, None, true).unwrap();
        assert!(kv_storage(&rotated, 16, 96).unwrap_err().to_string().contains("--kv-rotate"));
    }

    /// The prefix cache stays on for a model with a full-attention layer next to sliding ones
    /// (hybrid caching), and goes off when every layer slides within the context.
    #[test]
    fn prefix_cache_needs_one_full_attention_layer() {
        let mut model = ModelConfig::from_hf_config_json(SMOLLM2).unwrap();
        let mut cfg = EngineConfig::new("unused");
        cfg.max_model_len = Some(1024);
        for (i, layer) in model.layers.iter_mut().enumerate() {
            if i % 6 != 5 {
                layer.attention = AttentionKind::Sliding { window: 512 };
            }
        }
        let (resolved, _) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert!(resolved.kv_groups.len() > 1);
        assert!(resolved.enable_prefix_cache, "hybrid: cached");
        for layer in &mut model.layers {
            layer.attention = AttentionKind::Sliding { window: 512 };
        }
        let (resolved, _) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert!(!resolved.enable_prefix_cache, "all sliding: no cache");
        cfg.max_model_len = Some(512); // the window covers the context: full attention
        let (resolved, _) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert!(resolved.enable_prefix_cache);
    }

    /// The slots a block holds: by padding alone, SmolLM2's 30 layers made Gemma-like (every
    /// sixth full, window 512) take blocks of 5 slots, no padding; a pool that binds only in 6
    /// or more slots per block gets the least padding from 6 up: one padding slot in the full
    /// group (512 blocks at -c 8192) and five in the sliding ones (65 each).
    #[test]
    fn slots_grow_for_a_pool_the_adapter_cannot_bind_in_fewer() {
        let mut model = ModelConfig::from_hf_config_json(SMOLLM2).unwrap();
        for (i, layer) in model.layers.iter_mut().enumerate() {
            if i % 6 != 5 {
                layer.attention = AttentionKind::Sliding { window: 512 };
            }
        }
        let cfg = EngineConfig::new("unused");
        let (r, layout) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert_eq!((r.kv_groups.slots_per_block(), r.kv_groups.len()), (5, 6));
        assert_eq!(r.kv_groups.num_padding_slots(), 0);
        // one slot of one block: 3 KV heads × 16 tokens × 64 × 2 bytes, K and V
        let slot_block = layout.bytes_per_block() / 5;
        assert_eq!(slot_block, 3 * 16 * 64 * 2 * 2);
        // 1000 blocks a slot buffer: 5 slots bind 5,000 slot-blocks, a byte more needs 6
        assert_eq!(slots_for_pool(5_000 * slot_block, 1000, slot_block), 5);
        assert_eq!(slots_for_pool(5_000 * slot_block + 1, 1000, slot_block), 6);
        assert_eq!((slots_for_pool(0, 1000, slot_block), slots_for_pool(1, 0, 0)), (1, 1));
        assert_eq!(slots_for_pool(u64::MAX, 1, 1), usize::try_from(u64::MAX).unwrap());
        let (r, layout6) = ResolvedConfig::resolve_with_slots(&cfg, &model, 6).unwrap();
        let planned = PlannedContext { max_model_len: 8192, block_size: 16, step_tokens: 512 };
        assert_eq!((r.kv_groups.slots_per_block(), r.kv_groups.len()), (6, 6));
        assert_eq!(r.kv_groups.padding_slot_blocks(planned), 512 + 5 * 65);
        assert_eq!(layout6.bytes_per_block(), 6 * slot_block);
        // The engine's second look, with a binding of 1000 slot-blocks' K (half a slot-block):
        // a pool of 5,000 slot-blocks keeps 5 slots, one more byte takes 6, 8,000 take the
        // least padding from 8 up (8: 3 full and 7 sliding padding slots, 1,991 slot-blocks;
        // 10 would pad 2,885), and a pool no grouping binds takes the most slots there are (25,
        // the sliding layers'): the largest pool the adapter binds, then capped or refused.
        let binding = 1000 * slot_block / 2;
        let fit = |bytes: u64| {
            let (r, layout) = ResolvedConfig::resolve(&cfg, &model).unwrap();
            let (r, l) = r.fit_slots_to_binding(layout, &cfg, &model, bytes, binding).unwrap();
            assert_eq!(l.bytes_per_block(), r.kv_groups.slots_per_block() as u64 * slot_block);
            r.kv_groups.slots_per_block()
        };
        assert_eq!(fit(5_000 * slot_block), 5);
        assert_eq!(fit(5_000 * slot_block + 1), 6);
        assert_eq!(fit(8_000 * slot_block), 8);
        assert_eq!(fit(u64::MAX), 25);
    }

    /// A hybrid (the tiny Qwen3.5): the prefix cache stays on with state snapshot slots (2 per
    /// sequence by default, cut to one binding), goes off with `--state-snapshots 0`; an
    /// attention-only model gets no slots.
    #[test]
    fn recurrent_models_cache_prefixes_with_state_snapshots() {
        let json = include_str!("../../assets/tiny-qwen35/hf/config.json");
        let model = ModelConfig::from_hf_config_json(json).unwrap();
        let mut cfg = EngineConfig::new("unused");
        cfg.max_num_seqs = 3;
        let (mut resolved, _) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert!(resolved.enable_prefix_cache);
        assert_eq!(resolved.state_snapshots, 6);
        let slot = model.delta_net.unwrap().recurrent_state_bytes();
        resolved.fit_state_snapshots(&cfg, slot, 5 * slot);
        assert_eq!(resolved.state_snapshots, 2, "5 slots a binding, 3 running");
        cfg.state_snapshots = Some(0);
        let (resolved, _) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert!(!resolved.enable_prefix_cache);
        assert_eq!(resolved.state_snapshots, 0);
        let smol = ModelConfig::from_hf_config_json(SMOLLM2).unwrap();
        cfg.state_snapshots = Some(4);
        let (resolved, _) = ResolvedConfig::resolve(&cfg, &smol).unwrap();
        assert!(resolved.enable_prefix_cache);
        assert_eq!(resolved.state_snapshots, 0);
    }

    #[test]
    fn quantized_kv_resolves_to_its_own_block_bytes() {
        let model = ModelConfig::from_hf_config_json(SMOLLM2).unwrap();
        let mut cfg = EngineConfig::new("unused");
        cfg.max_model_len = Some(1024);
        let (resolved, layout) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert_eq!(resolved.kv_bytes_per_token, 23_040.0);
        assert_eq!(layout.bytes_per_block(), 368_640);
        assert_eq!(resolved.num_blocks, 64);
        cfg.kv_cache = KvCacheSpec::new(KvFormat::Int8, None, None, true).unwrap();
        let (resolved, layout) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert_eq!(resolved.kv_bytes_per_token, 12_420.0);
        assert_eq!(layout.bytes_per_block(), 198_720);
        assert_eq!(resolved.num_blocks, 64);
        assert!(resolved.kv_cache.rotate);
    }

    /// The device-memory check with a fake memory source: SmolLM2 at -c 1024 (64 blocks of
    /// 368,640 bytes: 22.5 MiB of KV) and 100 MiB of weights.
    #[test]
    fn a_pool_beyond_the_device_budget_is_refused_with_the_largest_that_fits() {
        use crate::gpu::{DeviceMemory, MemorySource};
        let model = ModelConfig::from_hf_config_json(SMOLLM2).unwrap();
        let mut cfg = EngineConfig::new("unused");
        cfg.max_model_len = Some(1024);
        let (resolved, _) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert_eq!(resolved.kv_cache_memory, 64 * 368_640);
        let weights = 100 << 20;
        let memory = |budget: u64| DeviceMemory {
            budget_bytes: Some(budget),
            heap_bytes: Some(budget),
            source: MemorySource::VulkanMemoryBudget,
        };
        // fits exactly; an unknown budget is not checked
        let exact = weights + 64 * 368_640;
        check_device_memory(&cfg, &resolved, memory(exact), weights).unwrap();
        check_device_memory(&cfg, &resolved, DeviceMemory::UNKNOWN, u64::MAX).unwrap();
        // one byte short: the default pool's sequences named, and the room left
        let err = check_device_memory(&cfg, &resolved, memory(exact - 1), weights).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("a KV cache of 22.5 MiB (1 sequences of -c 1024)"), "{msg}");
        assert!(msg.contains("Vulkan memory budget"), "{msg}");
        let room = crate::kv::format_bytes(64 * 368_640 - 1);
        assert!(msg.contains(&format!("give --kv-cache-memory at most {room}")), "{msg}");
        // a flag asking beyond it is named as the flag
        cfg.kv_cache_memory = Some(1 << 30);
        let (resolved, _) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        let err = check_device_memory(&cfg, &resolved, memory(512 << 20), weights).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("--kv-cache-memory 1 GiB"), "{msg}");
        assert!(msg.contains("at most 412 MiB"), "{msg}");
        // weights larger than the budget: no pool fits
        let err = check_device_memory(&cfg, &resolved, memory(64 << 20), weights).unwrap_err();
        assert!(err.to_string().contains("the weights alone do not fit"), "{err}");
    }

    /// `--gpu-memory-utilization` with a fake memory source: the budget left after the weights,
    /// the refusals, and the pool fitted back into the resolved config (-c fitted where not
    /// given, refused where given).
    #[test]
    fn serve_defaults_to_a_utilization_on_gpus_only() {
        let mut cfg = EngineConfig::new("m.gguf");
        assert_eq!((cfg.utilization_on(false), cfg.utilization_on(true)), (None, None));
        cfg.gpu_memory_utilization_default = Some(0.9);
        assert_eq!(cfg.utilization_on(false), Some(0.9), "a GPU takes the default");
        assert_eq!(cfg.utilization_on(true), None, "a CPU adapter keeps the default pool");
        cfg.kv_cache_memory = Some(1 << 30);
        assert_eq!(cfg.utilization_on(false), None, "a given pool wins");
        cfg.kv_cache_memory = None;
        cfg.gpu_memory_utilization = Some(0.5);
        assert_eq!((cfg.utilization_on(false), cfg.utilization_on(true)), (Some(0.5), Some(0.5)));
    }

    #[test]
    fn gpu_memory_utilization_arithmetic_and_context_fitting() {
        use crate::gpu::{DeviceMemory, MemorySource};
        let model = ModelConfig::from_hf_config_json(SMOLLM2).unwrap();
        let mut cfg = EngineConfig::new("unused");
        cfg.max_model_len = None; // 8192 by default
        let (resolved, layout) = ResolvedConfig::resolve(&cfg, &model).unwrap();
        assert_eq!(resolved.max_model_len, 8192);
        let memory = DeviceMemory {
            budget_bytes: Some(1 << 30),
            heap_bytes: Some(1 << 30),
            source: MemorySource::VulkanMemoryBudget,
        };
        let weights = 100 << 20;
        let fit = kv_fit(0.5, &resolved, &layout, memory, weights).unwrap();
        assert_eq!(fit.bytes, (512 << 20) - weights);
        assert_eq!(fit.bytes_per_block, 368_640);
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            let err = kv_fit(bad, &resolved, &layout, memory, weights).unwrap_err().to_string();
            assert!(err.contains("above 0 and at most 1"), "{bad}: {err}");
        }
        let err = kv_fit(0.05, &resolved, &layout, memory, weights).unwrap_err().to_string();
        assert!(err.contains("raise it above 0.098"), "{err}");
        let err = kv_fit(0.5, &resolved, &layout, DeviceMemory::UNKNOWN, weights).unwrap_err();
        assert!(err.to_string().contains("give --kv-cache-memory instead"), "{err}");
        // a pool of 100 blocks (1600 tokens) holds no 8192-token sequence: -c is fitted
        let mut r = resolved.clone();
        r.fit_pool(&cfg, 100, &layout).unwrap();
        assert_eq!((r.num_blocks, r.kv_cache_memory), (100, 100 * 368_640));
        let blocks = |len| r.kv_groups.blocks_for_lone_sequence(16, len, 512);
        assert!(blocks(r.max_model_len) <= 100 && blocks(r.max_model_len + 1) > 100);
        assert!(r.max_model_len <= 1600, "{}", r.max_model_len);
        // -c given: refused, naming both fixes
        cfg.max_model_len = Some(8192);
        let mut r = resolved.clone();
        let err = r.fit_pool(&cfg, 100, &layout).unwrap_err().to_string();
        assert!(err.contains("raise --gpu-memory-utilization or lower -c"), "{err}");
        // a pool that holds the sequence keeps -c
        let mut r = resolved.clone();
        r.fit_pool(&cfg, 1000, &layout).unwrap();
        assert_eq!(r.max_model_len, 8192);
    }
}
