//! Command-line interface: clap subcommands over the engine. Logs go to stderr; stdout carries
//! generated text and `--json` output only.

mod args;
mod bench;
mod bench_serve;
mod chat;
mod generate;
mod info;
mod perplexity;
mod plan;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::gpu::GpuOptions;

#[derive(Parser, Debug)]
#[command(name = "kvrun", version, about = "LLM inference on any wgpu GPU, with a paged KV cache")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub global: GlobalArgs,
}

/// Flags every subcommand takes.
#[derive(clap::Args, Debug, Clone)]
pub struct GlobalArgs {
    /// Backends to try: vulkan, metal, dx12, gl (comma list). Default: WGPU_BACKEND, else all.
    #[arg(long, global = true, env = "WGPU_BACKEND")]
    pub backend: Option<String>,
    /// Use the adapter whose name contains this text (e.g. llvmpipe). Default: WGPU_ADAPTER_NAME.
    #[arg(long, global = true, env = "WGPU_ADAPTER_NAME")]
    pub adapter: Option<String>,
    /// The bytes kvrun may allocate on the adapter (e.g. 8GiB), instead of what its driver
    /// reports (`kvrun info`): for backends that report none (Metal, DX12), or to leave room
    /// for other programs; --gpu-memory-utilization and the KV cache's checks use it.
    #[arg(long, global = true, value_parser = parse_device_memory)]
    pub device_memory: Option<u64>,
    /// More logging (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
}

impl GlobalArgs {
    pub fn gpu_options(&self) -> GpuOptions {
        GpuOptions {
            backend: self.backend.clone(),
            adapter: self.adapter.clone(),
            memory_budget: self.device_memory,
        }
    }
}

fn parse_device_memory(s: &str) -> Result<u64, String> {
    crate::kv::parse_bytes(s).map_err(|e| e.to_string())
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text for one prompt, streamed as it is produced.
    Generate(generate::GenerateArgs),
    /// Interactive multi-turn chat on stdin/stdout; earlier turns are prefix-cache hits.
    Chat(chat::ChatArgs),
    /// Perplexity of a text file (llama.cpp's llama-perplexity convention).
    Perplexity(perplexity::PerplexityArgs),
    /// KV-cache arithmetic for a model and a target, before anything is loaded (no GPU).
    Plan(plan::PlanArgs),
    /// Benchmarks (JSON + table).
    Bench(bench::BenchArgs),
    /// OpenAI-compatible HTTP server with Prometheus metrics.
    Serve(serve::ServeArgs),
    /// Show the GPU adapter, backend, driver, features and limits.
    Info(info::InfoArgs),
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn",
        1 => "info,wgpu_core=warn,wgpu_hal=warn,naga=warn",
        _ => "debug,wgpu_core=info,wgpu_hal=info,naga=info",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}

/// Entry point of the `kvrun` binary.
/// Mesa's Vulkan drivers (lavapipe among them) print "XDG_RUNTIME_DIR is invalid or not set"
/// once per window-system probe when it is unset (containers, services, ssh without a login
/// session); kvrun opens no window, so it points the variable at a private directory of its
/// own instead. Called first thing, while the process has one thread (`set_var`'s rule).
fn quiet_mesa_runtime_dir() {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt};
        let valid =
            std::env::var_os("XDG_RUNTIME_DIR").is_some_and(|d| std::path::Path::new(&d).is_dir());
        if valid {
            return;
        }
        // one directory per user (Linux names the process's owner in /proc/self), private
        let Ok(uid) = std::fs::metadata("/proc/self").map(|m| m.uid()) else { return };
        let dir = std::env::temp_dir().join(format!("kvrun-runtime-{uid}"));
        let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
        let made = std::fs::symlink_metadata(&dir)
            .is_ok_and(|m| m.is_dir() && m.uid() == uid && m.mode() & 0o777 == 0o700);
        if made {
            std::env::set_var("XDG_RUNTIME_DIR", &dir);
        }
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.global.verbose);
    quiet_mesa_runtime_dir();
    let result = match &cli.command {
        Command::Generate(args) => generate::run(args, &cli.global),
        Command::Chat(args) => chat::run(args, &cli.global),
        Command::Perplexity(args) => perplexity::run(args, &cli.global),
        Command::Plan(args) => plan::run(args),
        Command::Bench(args) => bench::run(args, &cli.global),
        Command::Serve(args) => serve::run(args, &cli.global),
        Command::Info(args) => info::run(args, &cli.global.gpu_options()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }
}
