//! `kvrun serve`: the OpenAI-compatible HTTP server (flags as `vllm serve`).

use std::net::{IpAddr, SocketAddr};

use super::args::{KvArgs, ModelArgs};
use super::GlobalArgs;
use crate::server::{self, ServeOptions};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (0.0.0.0 for every interface).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize.
    #[arg(long, env = "KVRUN_API_KEY")]
    pub api_key: Option<String>,
    /// Model name clients send and /v1/models lists. Default: the model file's name.
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Most sequences running together.
    #[arg(long, default_value_t = 8)]
    pub max_num_seqs: usize,
    /// Requests that may wait beyond the running ones; more get 503 with Retry-After.
    #[arg(long, default_value_t = 256)]
    pub max_queued_requests: usize,
    /// Reuse KV blocks of earlier requests with the same prefix (`false` to turn off).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub enable_prefix_caching: bool,
    /// Header whose value names a request's tenant (its own prefix-cache namespace).
    #[arg(long, default_value = "x-tenant-id")]
    pub tenant_header: String,
    /// Also export every metric under vLLM's `vllm:` names (for routers that read them).
    #[arg(long)]
    pub metrics_vllm_names: bool,
    #[command(flatten)]
    pub kv: KvArgs,
}

pub fn run(args: &ServeArgs, global: &GlobalArgs) -> anyhow::Result<()> {
    let path = args.model.path()?;
    if args.max_num_seqs == 0 {
        anyhow::bail!("--max-num-seqs 0 is invalid; use at least 1");
    }
    let mut cfg = args.kv.engine_config(path.clone(), global.gpu_options(), args.max_num_seqs)?;
    cfg.enable_prefix_cache &= args.enable_prefix_caching;
    let tenant_header = args.tenant_header.to_ascii_lowercase();
    if axum::http::HeaderName::from_bytes(tenant_header.as_bytes()).is_err() {
        anyhow::bail!("--tenant-header {:?} is not a valid HTTP header name", args.tenant_header);
    }
    let served_model_name = args.served_model_name.clone().unwrap_or_else(|| {
        let name = path.file_name().unwrap_or(path.as_os_str()).to_string_lossy();
        name.strip_suffix(".gguf").unwrap_or(&name).to_string()
    });
    let opts = ServeOptions {
        api_key: args.api_key.clone(),
        served_model_name,
        max_queued_requests: args.max_queued_requests,
        tenant_header,
        metrics_vllm_names: args.metrics_vllm_names,
    };
    server::run(SocketAddr::new(args.host, args.port), cfg, opts)
}
