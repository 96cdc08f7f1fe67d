//! `kvrun bench serve`: the multi-turn chat workload as HTTP streaming clients against any
//! OpenAI-compatible endpoint.

use std::path::PathBuf;
use std::time::Duration;

use super::bench::{write_outputs, ChatWorkloadArgs};
use crate::bench::serve::{self, ChatWorkload, Target};
use crate::bench::workload::Framing;

#[derive(clap::Args, Debug)]
pub struct ServeBenchArgs {
    /// The server's base URL (with or without /v1).
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// Bearer key to send.
    #[arg(long, env = "OPENAI_API_KEY")]
    pub api_key: Option<String>,
    /// Model name to send. Default: the first the server lists at /v1/models.
    #[arg(long)]
    pub model: Option<String>,
    #[command(flatten)]
    pub sizes: ChatWorkloadArgs,
    /// Seconds before a request is given up.
    #[arg(long, default_value_t = 1800)]
    pub timeout: u64,
    /// Write the JSON report to FILE (bare --json: print it instead of the tables).
    #[arg(long, num_args = 0..=1, default_missing_value = "-", value_name = "FILE")]
    pub json: Option<PathBuf>,
}

pub fn run(a: &ServeBenchArgs) -> anyhow::Result<()> {
    let spec = a.sizes.spec(Framing::ChatTemplate);
    let workload = ChatWorkload::generate(&spec).map_err(anyhow::Error::msg)?;
    let target = Target {
        url: a.url.clone(),
        api_key: a.api_key.clone(),
        model: a.model.clone(),
        timeout: Duration::from_secs(a.timeout.max(1)),
    };
    let total = (spec.users * spec.turns) as u64;
    let bar = indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template("requests [{bar:30}] {pos}/{len}, {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let progress = bar.clone();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let report = rt.block_on(serve::run(&target, &workload, move |r| {
        if let Some(e) = &r.error {
            progress.println(format!("user {} turn {}: {e}", r.user, r.turn));
        }
        progress.inc(1);
    }))?;
    bar.finish_and_clear();
    write_outputs(&report, &report.markdown(), &[], a.json.as_deref(), None)?;
    if report.errors > 0 {
        anyhow::bail!("{} of {} requests failed", report.errors, report.requests);
    }
    Ok(())
}
