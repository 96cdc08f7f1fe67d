//! `kvrun serve`: the OpenAI-compatible HTTP server (flags as `vllm serve`).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use super::args::{KvArgs, ModelArgs};
use super::GlobalArgs;
use crate::engine::{KvQuota, TenantConfig};
use crate::kv::parse_bytes;
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
    /// Split chat answers' `<think>…</think>` into `reasoning_content`: auto (when the chat
    /// template writes `</think>`), think (always; vLLM's qwen3 / deepseek_r1), none.
    #[arg(long, value_enum, default_value = "auto")]
    pub reasoning_parser: crate::server::ReasoningParserMode,
    /// Where sampling fields a request leaves out come from: auto (the model's
    /// generation_config.json or GGUF general.sampling.*), vllm (temperature 1, nothing else).
    #[arg(long, value_enum, default_value = "auto")]
    pub generation_config: crate::server::GenerationConfig,
    /// The format tool calls are read in, and written in under a required or named
    /// tool_choice: auto (the one the chat template teaches), hermes (<tool_call>; also
    /// qwen3_xml), llama3_json, mistral ([TOOL_CALLS]), openai (gpt-oss's harmony).
    #[arg(long, value_enum, default_value = "auto")]
    pub tool_call_parser: crate::server::ToolCallParserMode,
    /// Cap a tenant's KV blocks (running + cached; a hybrid's recurrent states count as their
    /// bytes): TENANT=FRACTION of the pool (0.25) or TENANT=BYTES (64MiB). Over it, the tenant's own cached blocks go first, then its
    /// requests wait; other tenants are not preempted for it. Repeatable.
    #[arg(long, value_parser = parse_tenant_quota)]
    pub tenant_kv_quota: Vec<TenantConfig>,
    /// API keys, one per line as `KEY TENANT` (# comments): a request made with a key belongs
    /// to that tenant (its own prefix-cache namespace); several keys may share a tenant.
    #[arg(long)]
    pub api_keys: Option<PathBuf>,
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
    // vLLM's default: most of a GPU's memory for KV (CPU adapters keep the default pool)
    cfg.gpu_memory_utilization_default = Some(0.9);
    let api_keys = match &args.api_keys {
        Some(file) => read_api_keys(file)?,
        None => HashMap::new(),
    };
    cfg.tenants = tenants(&args.tenant_kv_quota, &api_keys)?;
    if !cfg.enable_prefix_cache && cfg.tenants.iter().any(|t| t.kv_quota.is_some()) {
        anyhow::bail!("--tenant-kv-quota needs the prefix cache; drop --no-prefix-cache");
    }
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
        api_keys,
        served_model_name,
        max_queued_requests: args.max_queued_requests,
        tenant_header,
        metrics_vllm_names: args.metrics_vllm_names,
        reasoning_parser: args.reasoning_parser,
        tool_call_parser: args.tool_call_parser,
        generation_config: args.generation_config,
    };
    server::run(SocketAddr::new(args.host, args.port), cfg, opts)
}

/// `TENANT=FRACTION` (in (0, 1]) or `TENANT=BYTES`.
fn parse_tenant_quota(s: &str) -> Result<TenantConfig, String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected TENANT=FRACTION (0.25) or TENANT=BYTES (64MiB)"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: the tenant name is empty"));
    }
    let quota = match value.parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 1.0 => KvQuota::Fraction(f),
        Ok(f) if f.fract() != 0.0 || f <= 0.0 => {
            return Err(format!("{s:?}: a fraction must be in (0, 1]; or give bytes (64MiB)"))
        }
        _ => KvQuota::Bytes(parse_bytes(value).map_err(|e| format!("{s:?}: {e}"))?),
    };
    Ok(TenantConfig { name: name.to_string(), kv_quota: Some(quota) })
}

/// `KEY TENANT` lines; blank lines and `#` comments skipped. A key given twice is an error.
fn read_api_keys(path: &Path) -> anyhow::Result<HashMap<String, String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("--api-keys {}: cannot read it: {e}", path.display()))?;
    let mut keys = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(key), Some(tenant), None) = (parts.next(), parts.next(), parts.next()) else {
            anyhow::bail!("--api-keys {} line {}: expected `KEY TENANT`", path.display(), n + 1);
        };
        if keys.insert(key.to_string(), tenant.to_string()).is_some() {
            anyhow::bail!("--api-keys {} line {}: this key is listed twice", path.display(), n + 1);
        }
    }
    if keys.is_empty() {
        anyhow::bail!("--api-keys {}: no `KEY TENANT` line", path.display());
    }
    Ok(keys)
}

/// Every tenant to track: those with a quota, and those the API keys name.
fn tenants(
    quotas: &[TenantConfig],
    api_keys: &HashMap<String, String>,
) -> anyhow::Result<Vec<TenantConfig>> {
    let mut out: Vec<TenantConfig> = Vec::new();
    for q in quotas {
        if out.iter().any(|t| t.name == q.name) {
            anyhow::bail!("--tenant-kv-quota {}: this tenant has two quotas", q.name);
        }
        out.push(q.clone());
    }
    let mut named: Vec<&String> = api_keys.values().collect();
    named.sort();
    named.dedup();
    for name in named {
        if !out.iter().any(|t| &t.name == name) {
            out.push(TenantConfig { name: name.clone(), kv_quota: None });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_quotas_parse_fractions_and_bytes() {
        let q = parse_tenant_quota("alice=0.25").unwrap();
        assert_eq!((q.name.as_str(), q.kv_quota), ("alice", Some(KvQuota::Fraction(0.25))));
        let q = parse_tenant_quota("bob=64MiB").unwrap();
        assert_eq!(q.kv_quota, Some(KvQuota::Bytes(64 << 20)));
        let q = parse_tenant_quota("carol=1").unwrap();
        assert_eq!(q.kv_quota, Some(KvQuota::Fraction(1.0)));
        for bad in ["alice", "=0.5", "alice=0", "alice=1.5", "alice=-1", "alice=lots"] {
            assert!(parse_tenant_quota(bad).is_err(), "{bad}");
        }
    }
}
