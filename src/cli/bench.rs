//! `kvrun bench <workload>`: JSON and a Markdown table (and an SVG plot for `multiturn`).

use std::path::{Path, PathBuf};

use super::args::{KvArgs, ModelArgs, SamplingFilterArgs};
use super::GlobalArgs;
use crate::bench::bandwidth::BandwidthBench;
use crate::bench::concurrency::ConcurrencyBench;
use crate::bench::decode::DecodeBench;
use crate::bench::kvquant::{KvQuantBench, KvSetting};
use crate::bench::multiturn::{self, Budget, BudgetSizes, MultiturnReport, RunSetting};
use crate::bench::multiturn_report::{Acceptance, TierAcceptance};
use crate::bench::workload::{Framing, MultiturnSpec, MultiturnWorkload};
use crate::engine::{Engine, EngineConfig, EngineError, ResolvedConfig};
use crate::loader::ModelFile;
use crate::model::ModelError;
use crate::tokenizer::Tokenizer;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub workload: Workload,
}

#[derive(clap::Subcommand, Debug)]
pub enum Workload {
    /// The adapter's achievable memory bandwidth (read and copy probes over a buffer larger
    /// than any cache): the ceiling decode is measured against.
    Bandwidth(BandwidthArgs),
    /// Prefill and decode speed at several context lengths; GPU time of attention vs the rest.
    Decode(DecodeArgs),
    /// Multi-turn chat of several users sharing a system prompt, per KV budget: computed
    /// prefill tokens, cache hits and TTFT per turn (prefix-cache reuse vs eviction).
    Multiturn(MultiturnArgs),
    /// 1, 2, 4, 8 … concurrent requests: KV peak, TTFT, TPOT, throughput, latency.
    Concurrency(ConcurrencyArgs),
    /// Per KV format × scales × rotation: bytes per token, tokens that fit, perplexity, KLD and
    /// top-1 agreement vs f16 KV, attention GPU time per token at short and long context.
    KvQuant(KvQuantArgs),
    /// HTTP load against any OpenAI-compatible endpoint (kvrun serve or another server): the
    /// multi-turn chat workload as streaming clients; TTFT, TPOT, throughput, cached share.
    Serve(super::bench_serve::ServeBenchArgs),
}

#[derive(clap::Args, Debug)]
pub struct KvQuantArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Settings to compare, comma list of FORMAT[:K_SCALE[:V_SCALE]][+rot]
    /// (e.g. int4:per-channel:per-token+rot). Default: every format with its default scales,
    /// per-token K and per-tensor FP8 ablations, rotation at 8 and 4 bits.
    #[arg(long, value_delimiter = ',', default_value = crate::bench::kvquant::DEFAULT_SETTINGS)]
    pub settings: Vec<KvSetting>,
    /// English text for perplexity and KLD. Default: assets/text/alice-ch1-9.txt.
    #[arg(short, long)]
    pub file: Option<PathBuf>,
    /// Perplexity chunk length.
    #[arg(short = 'c', long = "ctx", default_value_t = 512)]
    pub ctx: usize,
    /// Perplexity chunks scored per setting.
    #[arg(long, default_value_t = 4)]
    pub chunks: usize,
    /// Context lengths at which decode attention is timed (comma list).
    #[arg(long, value_delimiter = ',', default_values_t = vec![128, 1024])]
    pub context_lengths: Vec<usize>,
    /// Decode steps timed per context length.
    #[arg(long, default_value_t = 8)]
    pub timed_steps: usize,
    /// Times each setting's decode this many times, the settings alternating (serpentine
    /// order); the table gives the medians and their range. Quality is measured once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// The budget "tokens in budget" is computed for.
    #[arg(long, default_value = "1GiB", value_parser = parse_budget_arg)]
    pub budget: u64,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Write the JSON report to FILE (bare --json: print it instead of the table).
    #[arg(long, num_args = 0..=1, default_missing_value = "-", value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the SVG plot (ΔPPL vs bytes per token) here (default: next to the JSON file).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

fn parse_budget_arg(s: &str) -> Result<u64, String> {
    crate::kv::parse_bytes(s).map_err(|e| e.to_string())
}

#[derive(clap::Args, Debug)]
pub struct BandwidthArgs {
    /// Bytes of the probe buffer (capped by the adapter's largest storage binding).
    #[arg(long, default_value = "256MiB", value_parser = parse_budget_arg)]
    pub bytes: u64,
    /// Timed runs per probe.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub repeats: u32,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct DecodeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Context lengths to decode at (comma list).
    #[arg(long, value_delimiter = ',', default_values_t = vec![128, 512, 2048])]
    pub context_lengths: Vec<usize>,
    /// Tokens decoded per context length.
    #[arg(long, default_value_t = 32)]
    pub decode_tokens: usize,
    /// Decode steps timed with GPU timestamps per context length.
    #[arg(long, default_value_t = 8)]
    pub timed_steps: usize,
    /// Also time every kernel kind separately (and report each one's achieved bandwidth).
    #[arg(long)]
    pub per_op: bool,
    /// Skip measuring the adapter's bandwidth (the roofline columns then read n/a).
    #[arg(long)]
    pub no_bandwidth: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// How the decoded tokens are picked (greedy by default; on a GPU a random draw runs
    /// there, so the bench measures its cost).
    #[command(flatten)]
    pub sampling: SamplingFilterArgs,
    #[command(flatten)]
    pub kv: KvArgs,
}

pub fn run(args: &BenchArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    match &args.workload {
        Workload::Bandwidth(a) => bandwidth(a, global),
        Workload::Decode(a) => decode(a, global),
        Workload::Multiturn(a) => multiturn(a, global),
        Workload::Concurrency(a) => concurrency(a, global),
        Workload::KvQuant(a) => kv_quant(a, global),
        Workload::Serve(a) => super::bench_serve::run(a),
    }
}

fn kv_quant(a: &KvQuantArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let path = a.model.path()?;
    let file = a.file.clone().unwrap_or_else(|| {
        let rel = Path::new("assets/text/alice-ch1-9.txt");
        if rel.exists() {
            rel.to_path_buf()
        } else {
            Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
        }
    });
    let text = std::fs::read_to_string(&file).map_err(|e| {
        anyhow::anyhow!("cannot read {}: {e} (give a text with -f)", file.display())
    })?;
    let mut base = EngineConfig::new(path.clone());
    base.gpu = global.gpu_options();
    base.block_size = a.block_size;
    base.max_num_batched_tokens = base.max_num_batched_tokens.min(a.ctx);
    let bench = KvQuantBench {
        settings: a.settings.clone(),
        ctx: a.ctx,
        chunks: Some(a.chunks),
        context_lengths: a.context_lengths.clone(),
        timed_steps: a.timed_steps,
        rounds: a.rounds as usize,
        budget_bytes: a.budget,
    };
    let steps = a.settings.len() as u64 * (3 + u64::from(a.rounds) - 1);
    let bar = indicatif::ProgressBar::new(steps).with_style(
        indicatif::ProgressStyle::with_template("kv-quant [{bar:30}] {pos}/{len} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let text_name = file.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let report = bench.run(&base, &text, &text_name, &model_name(&path), |s, step| {
        bar.set_message(format!("{s}: {step}"));
        bar.inc(1);
    })?;
    bar.finish_and_clear();
    write_outputs(&report, &report.markdown(), &report.plot(), a.json.as_deref(), a.plot.as_deref())
}

fn bandwidth(a: &BandwidthArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    if a.bytes < crate::kernels::bandwidth::WORD_BYTES {
        anyhow::bail!("--bytes {} is below one 16-byte word; give e.g. 256MiB", a.bytes);
    }
    let gpu = crate::gpu::Gpu::open(&global.gpu_options())?;
    let bench = BandwidthBench { bytes: a.bytes, repeats: a.repeats as usize };
    let report = bench.run(&gpu)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.markdown());
    }
    Ok(())
}

fn decode(a: &DecodeArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let sampling = a.sampling.params();
    sampling.validate()?;
    let path = a.model.path()?;
    let longest = a.context_lengths.iter().max().copied().unwrap_or(128);
    let mut kv = a.kv.clone();
    // The prefix cache stays on (unless --no-prefix-cache): DecodeBench::run gives each context
    // length its own namespace, so every prompt is computed once and its timed rerun reuses it.
    kv.max_model_len =
        Some(kv.max_model_len.unwrap_or(longest + a.decode_tokens.max(a.timed_steps) + 2));
    let cfg = kv.engine_config(path.clone(), global.gpu_options(), 1)?;
    let mut engine = Engine::load(&cfg)?;
    let bench = DecodeBench {
        context_lengths: a.context_lengths.clone(),
        decode_tokens: a.decode_tokens,
        timed_steps: a.timed_steps,
        per_op: a.per_op,
        bandwidth: match a.no_bandwidth {
            true => None,
            false => Some(BandwidthBench::default().run(engine.gpu())?),
        },
        sampling,
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let report = bench.run(&mut engine, &name)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.markdown());
    }
    Ok(())
}

/// Workload sizes of `bench multiturn`; explicit flags override them.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preset {
    /// 4 users, 1024-token system prompt, 8 turns, messages 100–200 tokens, replies 64.
    Default,
    /// 4 users, 256-token system prompt, 8 turns, messages 50–100 tokens, replies 16: for CPU
    /// adapters (about 13 minutes for `one,all` on lavapipe), long enough that the small budget
    /// can fall 4× behind the large one.
    Scaled,
    /// 2 users, 256-token system prompt, 4 turns, messages 50–100 tokens, replies 16.
    Smoke,
}

impl Preset {
    /// (users, system tokens, turns, message min, message max, reply tokens)
    fn sizes(self) -> [usize; 6] {
        match self {
            Preset::Default => [4, 1024, 8, 100, 200, 64],
            Preset::Scaled => [4, 256, 8, 50, 100, 16],
            Preset::Smoke => [2, 256, 4, 50, 100, 16],
        }
    }
}

/// The sizes of a multi-turn chat workload (`bench multiturn`, `bench serve`).
#[derive(clap::Args, Debug)]
pub struct ChatWorkloadArgs {
    /// Workload sizes; --users, --system-tokens … override single values.
    #[arg(long, value_enum, default_value_t = Preset::Default)]
    pub preset: Preset,
    /// Concurrent users (each one conversation).
    #[arg(long)]
    pub users: Option<usize>,
    /// Tokens of the system prompt all users share.
    #[arg(long)]
    pub system_tokens: Option<usize>,
    /// Turns per user.
    #[arg(long)]
    pub turns: Option<usize>,
    /// Fewest tokens of a user message.
    #[arg(long)]
    pub user_tokens_min: Option<usize>,
    /// Most tokens of a user message.
    #[arg(long)]
    pub user_tokens_max: Option<usize>,
    /// Tokens of each reply (`bench multiturn`: greedy, end-of-sequence ignored, so exactly
    /// this many; `bench serve`: at most this many).
    #[arg(long)]
    pub reply_tokens: Option<usize>,
    /// Seed of the generated messages.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl ChatWorkloadArgs {
    pub fn spec(&self, framing: Framing) -> MultiturnSpec {
        let [users, system, turns, min, max, reply] = self.preset.sizes();
        MultiturnSpec {
            users: self.users.unwrap_or(users),
            system_tokens: self.system_tokens.unwrap_or(system),
            turns: self.turns.unwrap_or(turns),
            user_tokens_min: self.user_tokens_min.unwrap_or(min),
            user_tokens_max: self
                .user_tokens_max
                .unwrap_or(max.max(self.user_tokens_min.unwrap_or(0))),
            reply_tokens: self.reply_tokens.unwrap_or(reply),
            seed: self.seed,
            framing,
        }
    }
}

#[derive(clap::Args, Debug)]
pub struct MultiturnArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sizes: ChatWorkloadArgs,
    /// Concatenate the texts without the chat template's role headers.
    #[arg(long)]
    pub raw: bool,
    /// KV budgets to run, comma list: `one` (the smallest that holds one conversation at its
    /// longest), `all` (every user's whole conversation), or sizes such as 64MiB.
    #[arg(long, value_delimiter = ',', default_value = "one,all", value_parser = Budget::parse)]
    pub kv_cache_memory: Vec<Budget>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most tokens computed in one step (the prefill chunk size).
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Run every budget without the prefix cache.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// After each budget, run it again with a host tier of this size for the blocks the pool
    /// evicts (vLLM's flag): `one`, `all` (every conversation) or a size such as 1GiB.
    #[arg(long, value_parser = Budget::parse)]
    pub kv_offloading_size: Option<Budget>,
    /// Add a run without the prefix cache at the largest budget (for comparison).
    #[arg(long)]
    pub compare_no_cache: bool,
    /// Print the workload's prefill arithmetic and budgets, and run nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Do not time attention with GPU timestamp queries.
    #[arg(long)]
    pub no_gpu_timing: bool,
    /// Write the JSON report to FILE (bare --json: print it instead of the tables).
    #[arg(long, num_args = 0..=1, default_missing_value = "-", value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write the SVG plot here (default: next to the JSON file, with .svg).
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
}

impl MultiturnArgs {
    fn spec(&self) -> MultiturnSpec {
        self.sizes.spec(if self.raw { Framing::Raw } else { Framing::ChatTemplate })
    }

    /// The runs: each budget (cache on unless --no-prefix-cache), then the comparison.
    fn settings(&self, sizes: &BudgetSizes) -> Vec<RunSetting> {
        let mut runs: Vec<RunSetting> = self
            .kv_cache_memory
            .iter()
            .flat_map(|b| {
                let run = RunSetting {
                    label: b.label(),
                    kv_cache_memory: b.bytes(sizes),
                    prefix_cache: !self.no_prefix_cache,
                    kv_offloading_size: None,
                };
                let host = self.kv_offloading_size.as_ref().filter(|_| !self.no_prefix_cache);
                let tier = host.map(|h| RunSetting {
                    label: format!("{} + host {}", b.label(), h.label()),
                    kv_offloading_size: Some(h.bytes(sizes)),
                    ..run.clone()
                });
                std::iter::once(run).chain(tier)
            })
            .collect();
        if self.compare_no_cache && !self.no_prefix_cache {
            let untiered = runs.iter().filter(|r| r.kv_offloading_size.is_none());
            if let Some(largest) = untiered.max_by_key(|r| r.kv_cache_memory).cloned() {
                runs.push(RunSetting { prefix_cache: false, ..largest });
            }
        }
        runs
    }
}

fn model_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn progress_bar(total: u64, message: String) -> indicatif::ProgressBar {
    let style = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {pos}/{len} tokens, {elapsed} elapsed, eta {eta}",
    )
    .expect("valid template")
    .progress_chars("=> ");
    indicatif::ProgressBar::new(total).with_style(style).with_message(message)
}

fn multiturn(a: &MultiturnArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let path = a.model.path()?;
    let file = ModelFile::open(&path)?;
    let tok = Tokenizer::from_source(file.tokenizer_source()?)?;
    let template = tok.chat_template()?;
    let workload = MultiturnWorkload::generate(&a.spec(), &tok, template.as_ref())
        .map_err(anyhow::Error::msg)?;
    let base = EngineConfig {
        gpu: global.gpu_options(),
        block_size: a.block_size,
        max_num_batched_tokens: a.max_num_batched_tokens,
        ..EngineConfig::new(path.clone())
    };
    let probe = RunSetting {
        label: String::new(),
        kv_cache_memory: 0,
        prefix_cache: true,
        kv_offloading_size: None,
    };
    let mut probe_cfg = probe.engine_config(&base, &workload);
    probe_cfg.kv_cache_memory = None;
    let max_model_len = workload.longest_conversation();
    let (_, layout) = ResolvedConfig::resolve(&probe_cfg, file.config()).map_err(|e| {
        anyhow::anyhow!(
            "the longest conversation needs a context of {max_model_len} tokens: {e}; use fewer \
             --turns or shorter messages"
        )
    })?;
    drop(file);
    let sizes = BudgetSizes::new(&layout, max_model_len, workload.spec.users);
    let arithmetic = workload.arithmetic(a.block_size);
    eprintln!(
        "multiturn: {} users × {} turns, context {max_model_len} tokens; prefill without reuse \
         {}, system prompt reused only {}, ideal {} (whole blocks {}); budgets: one conversation \
         {}, all {}",
        workload.spec.users,
        workload.spec.turns,
        arithmetic.no_reuse_prefill_tokens,
        arithmetic.system_only_prefill_tokens,
        arithmetic.ideal_prefill_tokens,
        arithmetic.ideal_block_prefill_tokens,
        crate::kv::format_bytes(sizes.one_conversation_bytes),
        crate::kv::format_bytes(sizes.all_conversations_bytes),
    );
    if a.dry_run {
        return Ok(());
    }
    let settings = a.settings(&sizes);
    let total = (workload.spec.users * workload.spec.turns * workload.spec.reply_tokens) as u64;
    let mut runs = Vec::new();
    let (mut adapter, mut backend) = (String::new(), String::new());
    for (idx, setting) in settings.iter().enumerate() {
        let mut engine = Engine::load(&setting.engine_config(&base, &workload))?;
        adapter = engine.gpu().info.name.clone();
        backend = format!("{:?}", engine.gpu().info.backend);
        let cache = if setting.prefix_cache { "cache on" } else { "cache off" };
        let bar = progress_bar(
            total,
            format!("run {}/{} {} {cache}", idx + 1, settings.len(), setting.label),
        );
        let report =
            multiturn::run(&mut engine, &workload, setting, !a.no_gpu_timing, &mut || bar.inc(1))?;
        bar.finish_and_clear();
        eprintln!(
            "run {}/{} ({}, {cache}): computed prefill {}, TTFT p50 {:.0} ms, {:.1} s",
            idx + 1,
            settings.len(),
            setting.label,
            report.totals.computed_prefill_tokens,
            report.totals.ttft_ms_p50,
            report.totals.wall_s
        );
        runs.push(report);
    }
    let replies_identical = runs.windows(2).all(|w| w[0].replies_sha256 == w[1].replies_sha256);
    let mut report = MultiturnReport {
        model: model_name(&path),
        adapter,
        backend,
        workload: workload.spec.clone(),
        block_size: a.block_size,
        max_model_len,
        budgets: sizes,
        arithmetic,
        runs,
        replies_identical,
        acceptance: None,
        tier_acceptance: None,
    };
    report.acceptance = Acceptance::new(&report);
    report.tier_acceptance = TierAcceptance::new(&report);
    write_outputs(
        &report,
        &report.markdown(),
        &report.panels(),
        a.json.as_deref(),
        a.plot.as_deref(),
    )
}

/// The tables (or, with `--json -`, the JSON) on stdout, the JSON file, the SVG plot if there
/// are panels (default: next to the JSON file).
pub(super) fn write_outputs(
    report: &impl serde::Serialize,
    markdown: &str,
    panels: &[crate::bench::plot::Panel],
    json: Option<&Path>,
    plot: Option<&Path>,
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    let to_stdout = json == Some(Path::new("-"));
    if to_stdout {
        println!("{text}");
    } else {
        print!("{markdown}");
    }
    let json_file = json.filter(|_| !to_stdout);
    if let Some(file) = json_file {
        std::fs::write(file, &text)
            .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
        eprintln!("wrote {}", file.display());
    }
    let plot = plot.map(Path::to_path_buf).or_else(|| json_file.map(|f| f.with_extension("svg")));
    if let Some(plot) = plot.filter(|_| !panels.is_empty()) {
        crate::bench::plot::write_svg(&plot, panels)?;
        eprintln!("wrote {}", plot.display());
    }
    Ok(())
}

#[derive(clap::Args, Debug)]
pub struct ConcurrencyArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Concurrency levels (requests submitted together), comma list.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 2, 4, 8])]
    pub levels: Vec<usize>,
    /// Tokens of each prompt.
    #[arg(long, default_value_t = 256)]
    pub prompt_tokens: usize,
    /// Tokens generated per request (end-of-sequence ignored).
    #[arg(long, default_value_t = 32)]
    pub output_tokens: usize,
    /// Seed of the prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write the JSON report to FILE (bare --json: print it instead of the table).
    #[arg(long, num_args = 0..=1, default_missing_value = "-", value_name = "FILE")]
    pub json: Option<PathBuf>,
    #[command(flatten)]
    pub kv: KvArgs,
}

fn concurrency(a: &ConcurrencyArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let path = a.model.path()?;
    let bench = ConcurrencyBench {
        levels: a.levels.clone(),
        prompt_tokens: a.prompt_tokens,
        output_tokens: a.output_tokens,
        seed: a.seed,
    };
    bench.validate().map_err(anyhow::Error::msg)?;
    let max_level = a.levels.iter().copied().max().unwrap_or(1);
    let cfg =
        bench.engine_config(&a.kv.engine_config(path.clone(), global.gpu_options(), max_level)?);
    let mut engine = Engine::load(&cfg).map_err(|e| match e {
        // buffers sized by --max-num-seqs: name the flag this command sets it from
        EngineError::Model(ModelError::BufferTooLarge { .. }) | EngineError::DeviceMemory(_) => {
            anyhow::anyhow!(
                "bench concurrency --levels {max_level} runs {max_level} sequences at once \
             (--max-num-seqs {max_level}); use smaller --levels: {e}"
            )
        }
        e => e.into(),
    })?;
    let total = (a.levels.iter().sum::<usize>() * a.output_tokens) as u64;
    let bar = progress_bar(total, "concurrency".into());
    let report = bench.run(&mut engine, &model_name(&path), &mut || bar.inc(1))?;
    bar.finish_and_clear();
    let json = serde_json::to_string_pretty(&report)?;
    match a.json.as_deref() {
        Some(p) if p == Path::new("-") => println!("{json}"),
        other => {
            print!("{}", report.markdown());
            if let Some(file) = other {
                std::fs::write(file, &json)
                    .map_err(|e| anyhow::anyhow!("cannot write {}: {e}", file.display()))?;
                eprintln!("wrote {}", file.display());
            }
        }
    }
    Ok(())
}
