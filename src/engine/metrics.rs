//! [`Metrics`]: the Prometheus metrics served at `/metrics`, named like vLLM's with a `kvrun:`
//! prefix (DESIGN.md), in a registry of our own (no globals). The engine feeds it
//! [`SchedulerStats`] after each step and the latency of each request; [`Metrics::encode`]
//! writes the OpenMetrics text.
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `kvrun:num_requests_running` / `_waiting` | gauge | sequences running / waiting |
//! | `kvrun:kv_cache_usage_perc` | gauge | fraction (0–1) of KV blocks held by live sequences |
//! | `kvrun:recurrent_state_bytes` | gauge | bytes of the running sequences' recurrent-layer states (Qwen3.5; 0 without such layers) |
//! | `kvrun:state_snapshot_slots` / `kvrun:state_snapshots` | gauge | prefix-cache state snapshot slots, and those holding a cached prefix's snapshot (hybrids; 0 otherwise) |
//! | `kvrun:state_snapshots_evicted_total` | counter | snapshots evicted to make room |
//! | `kvrun:prefix_cache_queries_total` / `_hits_total` | counter | prompt tokens looked up / found in the prefix cache |
//! | `kvrun:prefix_cache_evicted_blocks_total` | counter | cached KV blocks evicted to make room |
//! | `kvrun:prefix_cache_host_hits_total` | counter | of the hit tokens, those copied back from the host tier (`--kv-offloading-size`) |
//! | `kvrun:kv_host_tier_blocks{state}` | gauge | the host tier's slots: `used`, `total` (0 without a tier) |
//! | `kvrun:kv_host_tier_dropped_blocks_total` | counter | blocks the full host tier dropped (lost: recomputed on a hit) |
//! | `kvrun:kv_offload_bytes_total{direction}` | counter | KV bytes copied `to_host` (evicted blocks written back) and `to_gpu` (host hits) |
//! | `kvrun:kv_disk_tier_blocks` | gauge | block files in `--kv-cache-dir` for this model (series only with one) |
//! | `kvrun:kv_disk_blocks_total{op}` | counter | block files `written`, `read` back (into the host tier), `failed` (damaged, foreign, unwritable) |
//! | `kvrun:num_preemptions_total` | counter | sequences preempted (recompute) |
//! | `kvrun:prompt_tokens_total` / `kvrun:generation_tokens_total` | counter | tokens in / out |
//! | `kvrun:time_to_first_token_seconds` | histogram | arrival → first token |
//! | `kvrun:time_per_output_token_seconds` | histogram | between consecutive output tokens |
//! | `kvrun:e2e_request_latency_seconds` | histogram | arrival → last token of a finished request |
//! | `kvrun:request_disconnects_total` | counter | requests cancelled because their client went away |
//! | `kvrun:cache_config_info{block_size,num_gpu_blocks,kv_cache_memory[,gpu_memory_utilization]}` | gauge (1) | the KV pool's shape and bytes (and the fraction of the device's memory that sized it) |
//! | `kvrun:tenant_kv_blocks{tenant}` / `kvrun:tenant_kv_quota_blocks{tenant}` | gauge | KV blocks a tenant holds (running + cached; a recurrent model's states as blocks' worth of bytes) / its cap |
//! | `kvrun:tenant_recurrent_states{tenant}` | gauge | recurrent states a tenant holds: running sequences' and snapshots (hybrids; counted in its blocks) |
//! | `kvrun:tenant_num_requests_running{tenant}` / `_waiting{tenant}` | gauge | a tenant's sequences running / waiting |
//! | `kvrun:tenant_prefix_cache_queries_total{tenant}` / `_hits_total{tenant}` | counter | a tenant's prompt tokens looked up / found |
//!
//! Per-tenant series exist for the tenants configured at start (`--tenant-kv-quota`,
//! `--api-keys`), not for every header value a client sends (bounded cardinality).

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::sched::SchedulerStats;

/// Buckets of `time_to_first_token_seconds`, as vLLM's.
const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// Buckets of `time_per_output_token_seconds`, as vLLM's.
const TPOT_BUCKETS: [f64; 19] = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// Buckets of `e2e_request_latency_seconds`, as vLLM's.
const E2E_BUCKETS: [f64; 17] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
];

/// Every exported metric and the registry that encodes them. Cheap to update (atomics); share
/// it behind an `Arc` between the engine loop and the HTTP server.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    num_requests_running: Gauge,
    num_requests_waiting: Gauge,
    kv_cache_usage_perc: Gauge<f64, AtomicU64>,
    recurrent_state_bytes: Gauge,
    state_snapshot_slots: Gauge,
    state_snapshots: Gauge,
    state_snapshots_evicted: Counter,
    /// One running sequence's recurrent states (`set_cache_config`); 0 without such layers.
    state_bytes_per_sequence: AtomicU64,
    prefix_cache_queries: Counter,
    prefix_cache_hits: Counter,
    prefix_cache_evicted_blocks: Counter,
    prefix_cache_host_hits: Counter,
    host_tier_blocks: Family<Vec<(String, String)>, Gauge>,
    host_tier_dropped_blocks: Counter,
    offload_bytes: Family<Vec<(String, String)>, Counter>,
    /// Bytes of one KV block on the host (the tier's unit); 0 without a tier.
    host_block_bytes: AtomicU64,
    disk_tier_blocks: Family<Vec<(String, String)>, Gauge>,
    disk_blocks: Family<Vec<(String, String)>, Counter>,
    num_preemptions: Counter,
    prompt_tokens: Counter,
    generation_tokens: Counter,
    time_to_first_token_seconds: Histogram,
    time_per_output_token_seconds: Histogram,
    e2e_request_latency_seconds: Histogram,
    request_disconnects: Counter,
    cache_config_info: Family<Vec<(String, String)>, Gauge>,
    tenant: TenantFamilies,
}

/// The per-tenant series, labelled `tenant`.
#[derive(Debug, Default)]
struct TenantFamilies {
    kv_blocks: Family<TenantLabel, Gauge>,
    kv_quota_blocks: Family<TenantLabel, Gauge>,
    states: Family<TenantLabel, Gauge>,
    running: Family<TenantLabel, Gauge>,
    waiting: Family<TenantLabel, Gauge>,
    prefix_queries: Family<TenantLabel, Counter>,
    prefix_hits: Family<TenantLabel, Counter>,
}

type TenantLabel = Vec<(String, String)>;

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric at zero, registered under `kvrun:`.
    pub fn new() -> Self {
        let mut m = Metrics {
            num_requests_running: Gauge::default(),
            num_requests_waiting: Gauge::default(),
            kv_cache_usage_perc: Gauge::default(),
            recurrent_state_bytes: Gauge::default(),
            state_snapshot_slots: Gauge::default(),
            state_snapshots: Gauge::default(),
            state_snapshots_evicted: Counter::default(),
            state_bytes_per_sequence: AtomicU64::new(0),
            prefix_cache_queries: Counter::default(),
            prefix_cache_hits: Counter::default(),
            prefix_cache_evicted_blocks: Counter::default(),
            prefix_cache_host_hits: Counter::default(),
            host_tier_blocks: Family::default(),
            host_tier_dropped_blocks: Counter::default(),
            offload_bytes: Family::default(),
            host_block_bytes: AtomicU64::new(0),
            disk_tier_blocks: Family::default(),
            disk_blocks: Family::default(),
            num_preemptions: Counter::default(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            time_to_first_token_seconds: Histogram::new(TTFT_BUCKETS),
            time_per_output_token_seconds: Histogram::new(TPOT_BUCKETS),
            e2e_request_latency_seconds: Histogram::new(E2E_BUCKETS),
            request_disconnects: Counter::default(),
            cache_config_info: Family::default(),
            tenant: TenantFamilies::default(),
            registry: Registry::default(),
        };
        let r = &mut m.registry;
        r.register(
            "kvrun:num_requests_running",
            "Number of requests running on the GPU",
            m.num_requests_running.clone(),
        );
        r.register(
            "kvrun:num_requests_waiting",
            "Number of requests waiting to be admitted",
            m.num_requests_waiting.clone(),
        );
        r.register(
            "kvrun:kv_cache_usage_perc",
            "KV-cache usage: fraction of blocks held by live sequences (1 = full)",
            m.kv_cache_usage_perc.clone(),
        );
        r.register(
            "kvrun:recurrent_state_bytes",
            "Bytes of the running sequences' recurrent-layer states (fixed per sequence)",
            m.recurrent_state_bytes.clone(),
        );
        r.register(
            "kvrun:state_snapshot_slots",
            "Prefix-cache state snapshot slots of the recurrent layers (--state-snapshots)",
            m.state_snapshot_slots.clone(),
        );
        r.register(
            "kvrun:state_snapshots",
            "State snapshot slots holding a cached prefix's recurrent states",
            m.state_snapshots.clone(),
        );
        r.register(
            "kvrun:state_snapshots_evicted",
            "State snapshots evicted to make room",
            m.state_snapshots_evicted.clone(),
        );
        r.register(
            "kvrun:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache",
            m.prefix_cache_queries.clone(),
        );
        r.register(
            "kvrun:prefix_cache_hits",
            "Prompt tokens found in the prefix cache",
            m.prefix_cache_hits.clone(),
        );
        r.register(
            "kvrun:prefix_cache_evicted_blocks",
            "Cached KV blocks evicted from the prefix cache to make room",
            m.prefix_cache_evicted_blocks.clone(),
        );
        r.register(
            "kvrun:prefix_cache_host_hits",
            "Prompt tokens found in the prefix cache's host tier and copied back",
            m.prefix_cache_host_hits.clone(),
        );
        r.register(
            "kvrun:kv_host_tier_blocks",
            "KV blocks of the host tier (--kv-offloading-size): used, total",
            m.host_tier_blocks.clone(),
        );
        r.register(
            "kvrun:kv_host_tier_dropped_blocks",
            "KV blocks the full host tier dropped to make room",
            m.host_tier_dropped_blocks.clone(),
        );
        r.register(
            "kvrun:kv_offload_bytes",
            "KV bytes copied between the GPU pool and the host tier, by direction",
            m.offload_bytes.clone(),
        );
        r.register(
            "kvrun:kv_disk_tier_blocks",
            "KV block files in --kv-cache-dir for this model",
            m.disk_tier_blocks.clone(),
        );
        r.register(
            "kvrun:kv_disk_blocks",
            "KV block files written, read back and failed (damaged, foreign, unwritable)",
            m.disk_blocks.clone(),
        );
        r.register(
            "kvrun:num_preemptions",
            "Sequences preempted (recomputed later)",
            m.num_preemptions.clone(),
        );
        r.register("kvrun:prompt_tokens", "Prompt tokens admitted", m.prompt_tokens.clone());
        r.register("kvrun:generation_tokens", "Tokens generated", m.generation_tokens.clone());
        r.register(
            "kvrun:time_to_first_token_seconds",
            "Seconds from a request's arrival to its first token",
            m.time_to_first_token_seconds.clone(),
        );
        r.register(
            "kvrun:time_per_output_token_seconds",
            "Seconds between consecutive output tokens of a request",
            m.time_per_output_token_seconds.clone(),
        );
        r.register(
            "kvrun:e2e_request_latency_seconds",
            "Seconds from a request's arrival to its last token (finished requests)",
            m.e2e_request_latency_seconds.clone(),
        );
        r.register(
            "kvrun:request_disconnects",
            "Requests cancelled because their client went away",
            m.request_disconnects.clone(),
        );
        r.register(
            "kvrun:cache_config_info",
            "The KV cache's configuration (value 1; labels block_size, num_gpu_blocks)",
            m.cache_config_info.clone(),
        );
        let t = &m.tenant;
        r.register(
            "kvrun:tenant_kv_blocks",
            "KV blocks a tenant holds, running and cached (recurrent states as blocks' worth of bytes)",
            t.kv_blocks.clone(),
        );
        r.register(
            "kvrun:tenant_recurrent_states",
            "Recurrent states a tenant holds: running sequences' and prefix-cache snapshots",
            t.states.clone(),
        );
        r.register(
            "kvrun:tenant_kv_quota_blocks",
            "A tenant's cap on KV blocks (--tenant-kv-quota)",
            t.kv_quota_blocks.clone(),
        );
        r.register(
            "kvrun:tenant_num_requests_running",
            "A tenant's requests running",
            t.running.clone(),
        );
        r.register(
            "kvrun:tenant_num_requests_waiting",
            "A tenant's requests waiting (queued, or held back by its KV quota)",
            t.waiting.clone(),
        );
        r.register(
            "kvrun:tenant_prefix_cache_queries",
            "A tenant's prompt tokens looked up in the prefix cache",
            t.prefix_queries.clone(),
        );
        r.register(
            "kvrun:tenant_prefix_cache_hits",
            "A tenant's prompt tokens found in the prefix cache",
            t.prefix_hits.clone(),
        );
        m
    }

    /// Sets the gauges and advances the counters to the totals in `stats` (a total lower than the
    /// exported value, as after a scheduler restart, leaves the counter where it is).
    pub fn update_from(&self, stats: &SchedulerStats) {
        self.num_requests_running.set(stats.num_running as i64);
        self.num_requests_waiting.set(stats.num_waiting as i64);
        self.kv_cache_usage_perc.set(f64::from(stats.kv_usage));
        let per_seq = self.state_bytes_per_sequence.load(std::sync::atomic::Ordering::Relaxed);
        let state = per_seq.saturating_mul(stats.num_running as u64);
        self.recurrent_state_bytes.set(i64::try_from(state).unwrap_or(i64::MAX));
        self.state_snapshot_slots.set(i64::from(stats.num_snapshot_slots));
        self.state_snapshots.set(i64::try_from(stats.num_snapshots).unwrap_or(i64::MAX));
        for (counter, total) in [
            (&self.state_snapshots_evicted, stats.num_evicted_snapshots),
            (&self.prefix_cache_queries, stats.prefix_query_tokens),
            (&self.prefix_cache_hits, stats.prefix_hit_tokens),
            (&self.prefix_cache_evicted_blocks, stats.num_evicted_blocks),
            (&self.prefix_cache_host_hits, stats.host_hit_tokens),
            (&self.host_tier_dropped_blocks, stats.host.num_dropped),
            (&self.num_preemptions, stats.num_preemptions),
            (&self.prompt_tokens, stats.prompt_tokens),
            (&self.generation_tokens, stats.generation_tokens),
        ] {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
        let block = self.host_block_bytes.load(std::sync::atomic::Ordering::Relaxed);
        if block > 0 {
            let label = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
            let h = &stats.host;
            self.host_tier_blocks.get_or_create(&label("state", "used")).set(h.num_used as i64);
            self.host_tier_blocks.get_or_create(&label("state", "total")).set(h.num_slots as i64);
            for (direction, blocks) in [("to_host", h.num_offloaded), ("to_gpu", h.num_loaded)] {
                let counter = self.offload_bytes.get_or_create(&label("direction", direction));
                counter.inc_by((blocks * block).saturating_sub(counter.get()));
            }
        }
    }

    /// Sets the disk tier's series: `files` block files now, and its counters.
    pub fn update_disk(&self, files: usize, stats: &super::DiskTierStats) {
        self.disk_tier_blocks.get_or_create(&Vec::new()).set(files as i64);
        for (op, total) in
            [("written", stats.written), ("read", stats.read), ("failed", stats.failed)]
        {
            let counter = self.disk_blocks.get_or_create(&vec![("op".to_string(), op.to_string())]);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    /// Turns the host tier's series on: one KV block is `block_bytes` on the host.
    pub fn set_host_tier(&self, block_bytes: u64) {
        self.host_block_bytes.store(block_bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Records one request's time to first token.
    pub fn observe_ttft(&self, secs: f64) {
        self.time_to_first_token_seconds.observe(secs);
    }

    /// Records one gap between consecutive output tokens.
    pub fn observe_tpot(&self, secs: f64) {
        self.time_per_output_token_seconds.observe(secs);
    }

    /// Sets one tenant's series from its numbers now.
    pub fn update_tenant(&self, name: &str, stats: &crate::sched::TenantStats) {
        let label = vec![("tenant".to_string(), name.to_string())];
        let t = &self.tenant;
        t.kv_blocks.get_or_create(&label).set(stats.kv.num_held_blocks as i64);
        t.states.get_or_create(&label).set(stats.kv.num_held_states as i64);
        if let Some(q) = stats.kv.quota_blocks {
            t.kv_quota_blocks.get_or_create(&label).set(q as i64);
        }
        t.running.get_or_create(&label).set(stats.num_running as i64);
        t.waiting.get_or_create(&label).set(stats.num_waiting as i64);
        for (family, total) in [
            (&t.prefix_queries, stats.kv.prefix_query_tokens),
            (&t.prefix_hits, stats.kv.prefix_hit_tokens),
        ] {
            let counter = family.get_or_create(&label);
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    /// Records one finished request's arrival-to-last-token time.
    pub fn observe_e2e(&self, secs: f64) {
        self.e2e_request_latency_seconds.observe(secs);
    }

    /// Counts a request cancelled because its client went away.
    pub fn inc_disconnects(&self) {
        self.request_disconnects.inc();
    }

    /// Records one running sequence's recurrent-layer states in bytes (`recurrent_state_bytes`
    /// is that times the running sequences).
    pub fn set_state_bytes_per_sequence(&self, bytes: u64) {
        self.state_bytes_per_sequence.store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    /// Records the KV pool's shape (`cache_config_info`).
    pub fn set_cache_config(
        &self,
        block_size: usize,
        num_blocks: usize,
        kv_cache_memory: u64,
        gpu_memory_utilization: Option<f64>,
    ) {
        let mut labels = vec![
            ("block_size".to_string(), block_size.to_string()),
            ("num_gpu_blocks".to_string(), num_blocks.to_string()),
            ("kv_cache_memory".to_string(), kv_cache_memory.to_string()),
        ];
        if let Some(f) = gpu_memory_utilization {
            labels.push(("gpu_memory_utilization".to_string(), f.to_string()));
        }
        self.cache_config_info.get_or_create(&labels).set(1);
    }

    /// The OpenMetrics text exposition of every metric (ends with `# EOF`).
    pub fn encode(&self) -> String {
        let mut text = String::new();
        encode(&mut text, &self.registry).expect("writing to a String cannot fail");
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exports_vllm_names_and_tracks_scheduler_totals() {
        let metrics = Metrics::new();
        metrics.set_state_bytes_per_sequence(1000);
        let mut stats = SchedulerStats {
            num_running: 3,
            num_waiting: 2,
            num_preemptions: 1,
            prefix_query_tokens: 1000,
            prefix_hit_tokens: 640,
            prompt_tokens: 1000,
            generation_tokens: 50,
            kv_usage: 0.25,
            num_snapshot_slots: 8,
            num_snapshots: 3,
            num_evicted_snapshots: 2,
            num_evicted_blocks: 7,
            ..SchedulerStats::default()
        };
        metrics.update_from(&stats);
        stats.generation_tokens = 80;
        stats.num_running = 1;
        metrics.update_from(&stats);
        metrics.observe_ttft(0.003);
        metrics.observe_tpot(0.02);
        let text = metrics.encode();
        for line in [
            "# TYPE kvrun:num_requests_running gauge",
            "kvrun:num_requests_running 1",
            "kvrun:num_requests_waiting 2",
            "kvrun:kv_cache_usage_perc 0.25",
            "kvrun:recurrent_state_bytes 1000",
            "kvrun:state_snapshot_slots 8",
            "kvrun:state_snapshots 3",
            "# TYPE kvrun:state_snapshots_evicted counter",
            "kvrun:state_snapshots_evicted_total 2",
            "# TYPE kvrun:prefix_cache_queries counter",
            "kvrun:prefix_cache_queries_total 1000",
            "kvrun:prefix_cache_hits_total 640",
            "kvrun:prefix_cache_evicted_blocks_total 7",
            "kvrun:num_preemptions_total 1",
            "kvrun:prompt_tokens_total 1000",
            "kvrun:generation_tokens_total 80",
            "# TYPE kvrun:time_to_first_token_seconds histogram",
            "kvrun:time_to_first_token_seconds_bucket{le=\"0.001\"} 0",
            "kvrun:time_to_first_token_seconds_bucket{le=\"0.005\"} 1",
            "kvrun:time_to_first_token_seconds_bucket{le=\"2560.0\"} 1",
            "kvrun:time_per_output_token_seconds_bucket{le=\"0.025\"} 1",
            "kvrun:time_per_output_token_seconds_count 1",
            "# EOF",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn host_tier_series_count_bytes_both_ways() {
        let metrics = Metrics::new();
        let text = metrics.encode();
        assert!(!text.contains("kv_offload_bytes_total{"), "no tier, no series:\n{text}");
        metrics.set_host_tier(1000);
        let mut stats = SchedulerStats { host_hit_tokens: 64, ..SchedulerStats::default() };
        stats.host = crate::kv::HostTierStats {
            num_slots: 10,
            num_used: 4,
            num_offloaded: 7,
            num_loaded: 3,
            num_dropped: 1,
        };
        metrics.update_from(&stats);
        let text = metrics.encode();
        for line in [
            "kvrun:prefix_cache_host_hits_total 64",
            "kvrun:kv_host_tier_blocks{state=\"used\"} 4",
            "kvrun:kv_host_tier_blocks{state=\"total\"} 10",
            "kvrun:kv_host_tier_dropped_blocks_total 1",
            "kvrun:kv_offload_bytes_total{direction=\"to_host\"} 7000",
            "kvrun:kv_offload_bytes_total{direction=\"to_gpu\"} 3000",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        let disk = super::super::DiskTierStats { found: 3, written: 5, read: 2, failed: 1 };
        metrics.update_disk(6, &disk);
        let text = metrics.encode();
        for line in [
            "kvrun:kv_disk_tier_blocks 6",
            "kvrun:kv_disk_blocks_total{op=\"written\"} 5",
            "kvrun:kv_disk_blocks_total{op=\"read\"} 2",
            "kvrun:kv_disk_blocks_total{op=\"failed\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
    }

    #[test]
    fn counters_never_go_back() {
        let metrics = Metrics::new();
        let stats = SchedulerStats { num_preemptions: 5, ..SchedulerStats::default() };
        metrics.update_from(&stats);
        metrics.update_from(&SchedulerStats::default());
        assert!(metrics.encode().contains("kvrun:num_preemptions_total 5\n"));
    }
}
