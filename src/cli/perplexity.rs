//! `kvrun perplexity`: llama.cpp's `llama-perplexity` convention (see engine::perplexity).

use std::io::Write;

use super::args::{KvArgs, KvFormatArgs, ModelArgs};
use super::GlobalArgs;
use crate::engine::{Engine, PerplexityOptions};

#[derive(clap::Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score.
    #[arg(short, long)]
    pub file: std::path::PathBuf,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx", default_value_t = 512)]
    pub ctx: usize,
    /// Score at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Print one JSON object (ppl, chunks, tokens_scored, ctx, kv_cache_dtype, seconds).
    #[arg(long)]
    pub json: bool,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Most tokens computed in one step.
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    #[command(flatten)]
    pub format: KvFormatArgs,
    /// Also run the same chunks with f16 KV and report the KL divergence of this run's token
    /// distributions from it, and top-1 agreement (JSON key `kld`).
    #[arg(long)]
    pub kld: bool,
}

pub fn run(args: &PerplexityArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.file)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", args.file.display()))?;
    let kv = KvArgs {
        max_model_len: Some(args.ctx),
        kv_cache_memory: None,
        gpu_memory_utilization: None,
        kv_offloading_size: None,
        kv_cache_dir: None,
        kv_cache_dir_size: None,
        block_size: args.block_size,
        max_num_batched_tokens: args.max_num_batched_tokens.min(args.ctx),
        no_prefix_cache: true,
        state_snapshots: None,
        chat_template_file: None,
        format: args.format.clone(),
        kernel_family: Default::default(),
    };
    let mut cfg = kv.engine_config(args.model.path()?, global.gpu_options(), 1)?;
    cfg.max_logit_rows = Some(args.ctx.min(cfg.max_num_batched_tokens));
    let mut engine = Engine::load(&cfg)?;
    let mut base = if args.kld {
        let mut base_cfg = cfg.clone();
        base_cfg.kv_cache = Default::default();
        Some(Engine::load(&base_cfg)?)
    } else {
        None
    };
    let opts = PerplexityOptions { ctx: args.ctx, max_chunks: args.chunks };
    let report = engine.perplexity_vs(&text, &opts, base.as_mut(), |i, ppl| {
        if !args.json {
            eprint!("[{}]{ppl:.4},", i + 1);
            let _ = std::io::stderr().flush();
        }
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        eprintln!();
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5}  ({} chunks of {}, {} tokens scored, {:.1} s)",
            report.ppl,
            report.ppl_stderr,
            report.chunks,
            report.ctx,
            report.tokens_scored,
            report.seconds
        );
        if let Some(k) = &report.kld {
            println!(
                "vs {} KV: PPL {:.4} ({:+.3} %), mean KLD {:.6} +/- {:.6} (max {:.4}), top-1 \
                 agreement {:.2} %",
                k.base_kv_cache_dtype,
                k.base_ppl,
                k.ppl_delta_pct,
                k.kld_mean,
                k.kld_stderr,
                k.max_kld,
                k.top1_agreement * 100.0
            );
        }
    }
    Ok(())
}
