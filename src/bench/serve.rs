//! `kvrun bench serve`: an HTTP load generator for any OpenAI-compatible endpoint (kvrun's or
//! another server's), so that servers are measured by the same tool. U users share a system
//! prompt and chat for T turns, each user one streaming client, all users at once; each turn
//! sends the whole conversation so far (system, earlier messages and the server's own replies).
//! Reports TTFT (request sent → first content chunk), TPOT, end-to-end latency and throughput
//! percentiles, and the share of prompt tokens the server reports as cached
//! (`usage.prompt_tokens_details.cached_tokens`, asked for with `stream_options.include_usage`).
//!
//! Messages are seeded English-ish text of about the requested number of tokens (0.8 words a
//! token); token counts in the report are the server's own (`usage`).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures_util::StreamExt;
use serde_json::{json, Value};

use super::stats::percentile;
use super::workload::{english_text, MultiturnSpec, SplitMix64};

/// Where to send the load, and how.
#[derive(Clone, Debug)]
pub struct Target {
    /// Base URL, e.g. `http://127.0.0.1:8000` (with or without `/v1`).
    pub url: String,
    pub api_key: Option<String>,
    /// The model name to send; `None`: the first of `GET /v1/models`.
    pub model: Option<String>,
    /// Give up on a request after this long.
    pub timeout: Duration,
}

/// One request's figures.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct RequestReport {
    pub user: usize,
    /// 1-based.
    pub turn: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    pub ttft_ms: f64,
    /// Mean ms between content chunks after the first.
    pub tpot_ms: Option<f64>,
    pub latency_ms: f64,
    /// The failure, for a request that did not complete.
    pub error: Option<String>,
}

/// Percentiles of one figure.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

impl Percentiles {
    fn of(values: &[f64]) -> Self {
        let p = |q| percentile(values, q).unwrap_or(0.0);
        let mean = super::stats::mean(values).unwrap_or(0.0);
        Percentiles { p50: p(50.0), p90: p(90.0), p99: p(99.0), mean }
    }
}

/// One turn of every user.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct TurnSummary {
    pub turn: usize,
    pub requests: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub ttft_ms_p50: f64,
    pub ttft_ms_p99: f64,
}

/// The whole run (stable `--json` keys).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ServeBenchReport {
    pub url: String,
    pub model: String,
    pub workload: MultiturnSpec,
    pub requests: usize,
    pub errors: usize,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// `cached_tokens / prompt_tokens`.
    pub cached_share: f64,
    pub completion_tokens: u64,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub latency_ms: Percentiles,
    /// Completion tokens per second of wall time.
    pub throughput_tokens_per_s: f64,
    pub wall_s: f64,
    pub turns: Vec<TurnSummary>,
    pub per_request: Vec<RequestReport>,
}

/// The conversation texts: a shared system prompt and every user's messages.
#[derive(Clone, Debug)]
pub struct ChatWorkload {
    pub spec: MultiturnSpec,
    pub system: String,
    /// `[users][turns]`
    pub messages: Vec<Vec<String>>,
}

impl ChatWorkload {
    /// Seeded by `spec.seed`; about `n` tokens of text for an `n`-token size.
    pub fn generate(spec: &MultiturnSpec) -> Result<Self, String> {
        spec.validate()?;
        let words = |tokens: usize| (tokens * 4).div_ceil(5);
        let mut rng = SplitMix64::derive(spec.seed, &[u64::MAX]);
        let system = english_text(&mut rng, words(spec.system_tokens));
        let messages = (0..spec.users)
            .map(|user| {
                (0..spec.turns)
                    .map(|turn| {
                        let mut rng = SplitMix64::derive(spec.seed, &[user as u64, turn as u64]);
                        let len = rng.range(spec.user_tokens_min, spec.user_tokens_max);
                        english_text(&mut rng, words(len))
                    })
                    .collect()
            })
            .collect();
        Ok(ChatWorkload { spec: spec.clone(), system, messages })
    }
}

/// Runs `workload` against `target`: every user at once, turns in order per user.
/// `on_done` is called after each request (progress).
pub async fn run(
    target: &Target,
    workload: &ChatWorkload,
    on_done: impl Fn(&RequestReport) + Send + Sync + 'static,
) -> anyhow::Result<ServeBenchReport> {
    let base = target.url.trim_end_matches('/').trim_end_matches("/v1").to_string();
    let client = reqwest::Client::builder().timeout(target.timeout).build()?;
    let model = match &target.model {
        Some(m) => m.clone(),
        None => first_model(&client, &base, target.api_key.as_deref()).await?,
    };
    let on_done = std::sync::Arc::new(on_done);
    let start = Instant::now();
    let users: Vec<_> = (0..workload.spec.users)
        .map(|user| {
            let (client, base, model) = (client.clone(), base.clone(), model.clone());
            let (key, workload, on_done) =
                (target.api_key.clone(), workload.clone(), on_done.clone());
            tokio::spawn(async move {
                let mut messages = vec![json!({"role": "system", "content": workload.system})];
                let mut out = Vec::new();
                for (turn, text) in workload.messages[user].iter().enumerate() {
                    messages.push(json!({"role": "user", "content": text}));
                    let body = json!({
                        "model": model,
                        "messages": messages,
                        "max_tokens": workload.spec.reply_tokens,
                        "temperature": 0,
                        "stream": true,
                        "stream_options": {"include_usage": true},
                    });
                    let (mut report, reply) = send(&client, &base, key.as_deref(), &body).await;
                    report.user = user;
                    report.turn = turn + 1;
                    on_done(&report);
                    let failed = report.error.is_some();
                    out.push(report);
                    if failed {
                        break; // the conversation cannot go on without its reply
                    }
                    messages.push(json!({"role": "assistant", "content": reply}));
                }
                out
            })
        })
        .collect();
    let mut per_request = Vec::new();
    for u in users {
        per_request.extend(u.await.context("a client task failed")?);
    }
    let wall_s = start.elapsed().as_secs_f64();
    Ok(summarize(&base, model, workload, per_request, wall_s))
}

/// The first model the endpoint lists.
async fn first_model(
    client: &reqwest::Client,
    base: &str,
    key: Option<&str>,
) -> anyhow::Result<String> {
    let mut req = client.get(format!("{base}/v1/models"));
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.with_context(|| format!("GET {base}/v1/models"))?;
    if !resp.status().is_success() {
        bail!("GET {base}/v1/models answered {}; pass --model or --api-key", resp.status());
    }
    let v: Value = resp.json().await?;
    match v["data"][0]["id"].as_str() {
        Some(id) => Ok(id.to_string()),
        None => bail!("GET {base}/v1/models lists no model; pass --model"),
    }
}

/// One streaming chat request: its figures and the reply text.
async fn send(
    client: &reqwest::Client,
    base: &str,
    key: Option<&str>,
    body: &Value,
) -> (RequestReport, String) {
    let sent = Instant::now();
    let mut report = RequestReport::default();
    let mut reply = String::new();
    match stream_chat(client, base, key, body, sent, &mut report, &mut reply).await {
        Ok(()) => {}
        Err(e) => report.error = Some(format!("{e:#}")),
    }
    report.latency_ms = sent.elapsed().as_secs_f64() * 1e3;
    (report, reply)
}

async fn stream_chat(
    client: &reqwest::Client,
    base: &str,
    key: Option<&str>,
    body: &Value,
    sent: Instant,
    report: &mut RequestReport,
    reply: &mut String,
) -> anyhow::Result<()> {
    let mut req = client.post(format!("{base}/v1/chat/completions")).json(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await?;
    if !resp.status().is_success() {
        let status = resp.status();
        bail!("{status}: {}", resp.text().await.unwrap_or_default());
    }
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    let mut chunks = 0u64;
    let mut done = false;
    while let Some(bytes) = stream.next().await {
        buf.extend_from_slice(&bytes?);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&event);
            for data in text.lines().filter_map(|l| l.strip_prefix("data:")) {
                let data = data.trim();
                if data == "[DONE]" {
                    done = true;
                    continue;
                }
                let v: Value = serde_json::from_str(data).context("a chunk that is not JSON")?;
                if let Some(e) = v.get("error") {
                    bail!("the server reported an error midway: {e}");
                }
                if let Some(content) = v["choices"][0]["delta"]["content"].as_str() {
                    if !content.is_empty() {
                        let now = Instant::now();
                        first.get_or_insert(now);
                        last = Some(now);
                        chunks += 1;
                        reply.push_str(content);
                    }
                }
                if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                    report.prompt_tokens = u["prompt_tokens"].as_u64().unwrap_or(0);
                    report.completion_tokens = u["completion_tokens"].as_u64().unwrap_or(0);
                    report.cached_tokens =
                        u["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
                }
            }
        }
    }
    if !done {
        bail!("the stream ended without data: [DONE]");
    }
    let first = first.unwrap_or_else(Instant::now);
    report.ttft_ms = (first - sent).as_secs_f64() * 1e3;
    if let (Some(last), true) = (last, chunks > 1) {
        report.tpot_ms = Some((last - first).as_secs_f64() * 1e3 / (chunks - 1) as f64);
    }
    Ok(())
}

/// Aggregates the requests of a run.
pub fn summarize(
    url: &str,
    model: String,
    workload: &ChatWorkload,
    per_request: Vec<RequestReport>,
    wall_s: f64,
) -> ServeBenchReport {
    let ok: Vec<&RequestReport> = per_request.iter().filter(|r| r.error.is_none()).collect();
    let sum = |f: fn(&RequestReport) -> u64| ok.iter().map(|r| f(r)).sum::<u64>();
    let (prompt_tokens, cached_tokens) = (sum(|r| r.prompt_tokens), sum(|r| r.cached_tokens));
    let completion_tokens = sum(|r| r.completion_tokens);
    let ttft: Vec<f64> = ok.iter().map(|r| r.ttft_ms).collect();
    let tpot: Vec<f64> = ok.iter().filter_map(|r| r.tpot_ms).collect();
    let latency: Vec<f64> = ok.iter().map(|r| r.latency_ms).collect();
    let turns = (1..=workload.spec.turns)
        .map(|turn| {
            let of_turn: Vec<&&RequestReport> = ok.iter().filter(|r| r.turn == turn).collect();
            let ttft: Vec<f64> = of_turn.iter().map(|r| r.ttft_ms).collect();
            TurnSummary {
                turn,
                requests: of_turn.len(),
                prompt_tokens: of_turn.iter().map(|r| r.prompt_tokens).sum(),
                cached_tokens: of_turn.iter().map(|r| r.cached_tokens).sum(),
                ttft_ms_p50: percentile(&ttft, 50.0).unwrap_or(0.0),
                ttft_ms_p99: percentile(&ttft, 99.0).unwrap_or(0.0),
            }
        })
        .collect();
    ServeBenchReport {
        url: url.to_string(),
        model,
        workload: workload.spec.clone(),
        requests: per_request.len(),
        errors: per_request.len() - ok.len(),
        prompt_tokens,
        cached_tokens,
        cached_share: if prompt_tokens == 0 {
            0.0
        } else {
            cached_tokens as f64 / prompt_tokens as f64
        },
        completion_tokens,
        ttft_ms: Percentiles::of(&ttft),
        tpot_ms: Percentiles::of(&tpot),
        latency_ms: Percentiles::of(&latency),
        throughput_tokens_per_s: if wall_s > 0.0 { completion_tokens as f64 / wall_s } else { 0.0 },
        wall_s,
        turns,
        per_request,
    }
}

impl ServeBenchReport {
    /// The Markdown tables: per turn, then the summary.
    pub fn markdown(&self) -> String {
        let mut s = format!(
            "`bench serve` — {} at {}: {} users × {} turns, system prompt ~{} tokens, messages \
             ~{}–{}, replies ≤ {} tokens\n\n",
            self.model,
            self.url,
            self.workload.users,
            self.workload.turns,
            self.workload.system_tokens,
            self.workload.user_tokens_min,
            self.workload.user_tokens_max,
            self.workload.reply_tokens
        );
        s +=
            "| turn | requests | prompt tokens | cached | cached % | TTFT p50 ms | TTFT p99 ms |\n";
        s += "|---:|---:|---:|---:|---:|---:|---:|\n";
        for t in &self.turns {
            let share = 100.0 * t.cached_tokens as f64 / t.prompt_tokens.max(1) as f64;
            s += &format!(
                "| {} | {} | {} | {} | {:.1} | {:.0} | {:.0} |\n",
                t.turn,
                t.requests,
                t.prompt_tokens,
                t.cached_tokens,
                share,
                t.ttft_ms_p50,
                t.ttft_ms_p99
            );
        }
        s += "\n| requests | errors | cached % | TTFT p50 ms | TTFT p90 ms | TTFT p99 ms | TPOT p50 ms | TPOT p99 ms | latency p50 ms | throughput tok/s | wall s |\n";
        s += "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        s += &format!(
            "| {} | {} | {:.1} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} | {:.0} | {:.2} | {:.1} |\n",
            self.requests,
            self.errors,
            100.0 * self.cached_share,
            self.ttft_ms.p50,
            self.ttft_ms.p90,
            self.ttft_ms.p99,
            self.tpot_ms.p50,
            self.tpot_ms.p99,
            self.latency_ms.p50,
            self.throughput_tokens_per_s,
            self.wall_s
        );
        s
    }
}
