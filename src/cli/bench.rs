//! `kvrun bench <workload>`: JSON and a Markdown table.

use super::args::{KvArgs, ModelArgs};
use super::GlobalArgs;
use crate::bench::decode::DecodeBench;
use crate::engine::Engine;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub workload: Workload,
}

#[derive(clap::Subcommand, Debug)]
pub enum Workload {
    /// Prefill and decode speed at several context lengths; GPU time of attention vs the rest.
    Decode(DecodeArgs),
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
    /// Also time every kernel kind separately.
    #[arg(long)]
    pub per_op: bool,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kv: KvArgs,
}

pub fn run(args: &BenchArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    match &args.workload {
        Workload::Decode(a) => decode(a, global),
    }
}

fn decode(a: &DecodeArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let path = a.model.path()?;
    let longest = a.context_lengths.iter().max().copied().unwrap_or(128);
    let mut kv = a.kv.clone();
    // Every prompt must be computed: the prompts of longer contexts start with the shorter
    // ones, and a prefix hit would count cached tokens as prefilled (DecodeBench::run says so).
    kv.no_prefix_cache = true;
    kv.max_model_len =
        Some(kv.max_model_len.unwrap_or(longest + a.decode_tokens.max(a.timed_steps) + 2));
    let cfg = kv.engine_config(path.clone(), global.gpu_options(), 1);
    let mut engine = Engine::load(&cfg)?;
    let bench = DecodeBench {
        context_lengths: a.context_lengths.clone(),
        decode_tokens: a.decode_tokens,
        timed_steps: a.timed_steps,
        per_op: a.per_op,
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
