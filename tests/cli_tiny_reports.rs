//! `perplexity --kld`, `bench decode` and `bench kv-quant` end to end through the binary on the
//! tiny model: they run, and their `--json` reports hold the stable keys (DESIGN.md) with values
//! that make sense (quantized KV close to f16, int4 further than int8, bytes per token exact).

mod common;

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn tiny_model() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-llama/tiny-llama-q.gguf");
    p.to_string_lossy().into_owned()
}

fn text() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/text/alice-ch1-9.txt");
    p.to_string_lossy().into_owned()
}

/// `kvrun ARGS` → its JSON on stdout (the test fails on a non-zero exit).
fn json(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_kvrun")).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kvrun {args:?} failed:\n{stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("kvrun {args:?}: {e}"))
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

#[test]
fn perplexity_with_kld_reports_the_f16_baseline() {
    if common::gpu().is_none() {
        return;
    }
    let (m, f) = (tiny_model(), text());
    let args = ["perplexity", "-m", &m, "-f", &f, "-c", "64", "--chunks", "2"];
    let r = json(&[&args[..], &["--kv-cache-dtype", "int8", "--kld", "--json"]].concat());
    assert_eq!((r["chunks"].as_u64(), r["ctx"].as_u64()), (Some(2), Some(64)));
    assert_eq!(r["tokens_scored"], 62, "the second half of each 64-token chunk, minus one");
    assert_eq!(r["kv_cache_dtype"], "int8");
    let kld = &r["kld"];
    assert_eq!(kld["base_kv_cache_dtype"], "f16");
    let (ppl, base) = (num(&r["ppl"]), num(&kld["base_ppl"]));
    assert!(ppl.is_finite() && ppl > 1.0 && base > 1.0);
    // int8 KV barely moves the distributions of the (random-weight) tiny model.
    assert!((ppl - base).abs() / base < 0.01, "int8 PPL {ppl} vs f16 {base}");
    let kld_mean = num(&kld["kld_mean"]);
    assert!(kld_mean > 0.0 && kld_mean < 1e-3, "kld_mean {kld_mean}");
    assert!(num(&kld["max_kld"]) >= kld_mean);
    let top1 = num(&kld["top1_agreement"]);
    assert!((0.9..=1.0).contains(&top1), "top1 {top1}");
    // The f16 baseline itself, without --kld, is the same number: there the GPU reduces each
    // position's log-probability in f32 (kernels::logprob), with --kld the host does it from
    // the rows in f64, so the two agree to f32 rounding, not bit for bit.
    let f16 = json(&[&args[..], &["--json"]].concat());
    let plain = num(&f16["ppl"]);
    assert!((plain / base - 1.0).abs() < 1e-6, "the --kld baseline {base} is the f16 run {plain}");
}

/// Dispatches per decode token of the tiny Llama (see `bench_decode_reports_each_context_length`),
/// with or without the layers' two RMSNorm dispatches, at a context of `keys`: one attention
/// dispatch a layer while the keys fit one partition of its family (the tiny model's 16-channel
/// heads take the workgroup family's 64 keys: one-pass decode), two past it (partials + reduce).
fn tiny_dispatches(norm_dispatches: bool, keys: u64) -> f64 {
    let norms = if norm_dispatches { 2.0 } else { 0.0 };
    let attention = if keys <= 64 { 1.0 } else { 2.0 };
    (5.0 + attention + norms) + (6.0 + attention + norms) + 4.0
}

#[test]
fn bench_decode_reports_each_context_length() {
    let Some(t) = common::gpu() else { return };
    let norms = !t.kernels.config.norm_on_load();
    let m = tiny_model();
    let r = json(&[
        "bench",
        "decode",
        "-m",
        &m,
        "--context-lengths",
        "16,64",
        "--decode-tokens",
        "4",
        "--timed-steps",
        "2",
        "--json",
    ]);
    assert_eq!(r["context_lengths"], serde_json::json!([16, 64]));
    for key in ["prefill_tokens_per_s", "decode_tokens_per_s", "attention_gpu_ms_per_token"] {
        let v = r[key].as_array().unwrap_or_else(|| panic!("{key}: {r}"));
        assert_eq!(v.len(), 2, "{key}");
        assert!(v.iter().all(|x| num(x) > 0.0), "{key}: {v:?}");
    }
    // tiny model: 2 layers × 2 KV heads × 16 dims × K and V × 2 bytes = 256 bytes per token,
    // in whole blocks of 16 tokens.
    let used: Vec<u64> = r["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["kv_bytes_used"].as_u64().unwrap())
        .collect();
    assert!(used[0] >= 16 * 256 && used[0].is_multiple_of(16 * 256), "{used:?}");
    assert!(used[1] > used[0], "more context holds more KV: {used:?}");
    // The roofline: the 2 timed steps attend to ctx + 1 and ctx + 2 keys (mean ctx + 1 in
    // whole keys), 256 bytes each; every linear weight once; achieved GB/s = bytes ÷ GPU time.
    let read_gb_s = num(&r["bandwidth"]["read_gb_s"]);
    assert!(read_gb_s > 0.0, "{}", r["bandwidth"]);
    for (p, ctx) in r["points"].as_array().unwrap().iter().zip([16u64, 64]) {
        let b = &p["step_bytes"];
        assert_eq!(b["kv_full"].as_u64().unwrap(), (ctx + 1) * 256, "{b}");
        assert_eq!(b["kv_sliding"].as_u64().unwrap(), 0, "{b}");
        let weights = b["weights"].as_u64().unwrap();
        assert!(weights > 0, "{b}");
        assert_eq!(b["total"].as_u64().unwrap(), weights + (ctx + 1) * 256, "{b}");
        // Dispatches per decode step of the 2-layer tiny Llama: per layer RMSNorm, QKV (one
        // matmul), RoPE + KV write (one dispatch), attention (one-pass at 17 and 18 keys,
        // partials + reduce at 65 and 66), O, RMSNorm, gate/up with the SiLU·mul epilogue (one
        // matmul), down = 8 or 9, but layer 1's V is Q4_1 beside Q4_0 Q/K, so its QKV is two
        // matmuls (one more); then embedding, final norm, LM head and the greedy argmax. Where
        // the adapter's linear variant norms on load, the two RMSNorms of a layer are part of
        // its matmuls.
        let want = tiny_dispatches(norms, ctx + 2);
        assert_eq!(p["dispatches_per_token"].as_f64(), Some(want), "{p}");
        // recording and submitting a step takes the host some time, never none (0 = unset)
        let host = num(&p["host_ms_per_token"]);
        assert!(host.is_finite() && host > 0.0, "host ms per token: {p}");
        // greedy decode: the GPU picks the token, one u32 comes back a step
        assert_eq!(p["readback_bytes_per_token"].as_f64(), Some(4.0), "{p}");
        let (ms, roof) = (num(&p["gpu_ms_per_token"]), &p["roofline"]);
        let achieved = num(&roof["achieved_gb_s"]);
        let want = b["total"].as_u64().unwrap() as f64 / (ms * 1e6);
        assert!((achieved - want).abs() <= 1e-9 * want, "{achieved} vs {want}");
        assert!((num(&roof["fraction"]) - achieved / read_gb_s).abs() <= 1e-9, "{roof}");
    }
}

/// The discrete-GPU kernel family (forced here) folds each layer's input RMSNorms into the
/// matmuls that read them: two dispatches fewer per layer than the separate norms.
#[test]
fn bench_decode_gpu_family_norms_on_load() {
    if common::gpu().is_none() {
        return;
    }
    let m = tiny_model();
    let args = ["bench", "decode", "-m", &m, "--context-lengths", "16", "--decode-tokens", "2"];
    let r = json(
        &[&args[..], &["--timed-steps", "1", "--no-bandwidth", "--kernel-family", "gpu", "--json"]]
            .concat(),
    );
    let p = &r["points"][0];
    assert_eq!(p["dispatches_per_token"].as_f64(), Some(tiny_dispatches(false, 18)), "{p}");
}

#[test]
fn bench_bandwidth_reports_both_probes() {
    let Some(t) = common::gpu() else { return };
    let int64 = t.gpu.caps.shader_int64;
    let r = json(&["bench", "bandwidth", "--bytes", "1MiB", "--repeats", "3", "--json"]);
    assert_eq!(r["buffer_bytes"].as_u64(), Some(1 << 20), "{r}");
    let probes = r["probes"].as_array().unwrap();
    let names: Vec<(&str, &str)> = probes
        .iter()
        .map(|p| (p["probe"].as_str().unwrap(), p["loads"].as_str().unwrap()))
        .collect();
    // both load widths where the adapter has 64-bit shader integers (lavapipe has)
    let want: Vec<(&str, &str)> = ["read", "copy"]
        .into_iter()
        .flat_map(|p| [(p, "vec4<u32>"), (p, "vec2<u64>")].into_iter().take(1 + usize::from(int64)))
        .collect();
    assert_eq!(names, want);
    for p in probes {
        assert_eq!(p["runs_ms"].as_array().unwrap().len(), 3, "{p}");
        assert!(num(&p["best_gb_s"]) >= num(&p["median_gb_s"]), "{p}");
        assert!(num(&p["median_gb_s"]) > 0.0, "{p}");
        let bytes = if p["probe"] == "read" { 1 << 20 } else { 2 << 20 };
        assert_eq!(p["bytes_per_run"].as_u64(), Some(bytes), "{p}");
    }
    let best = |probe: &str| {
        probes
            .iter()
            .filter(|p| p["probe"] == probe)
            .map(|p| num(&p["best_gb_s"]))
            .fold(0.0, f64::max)
    };
    assert_eq!(num(&r["read_gb_s"]), best("read"));
    assert_eq!(num(&r["copy_gb_s"]), best("copy"));
    let out = Command::new(env!("CARGO_BIN_EXE_kvrun"))
        .args(["bench", "bandwidth", "--repeats", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--repeats"));
}

/// A context length that does not fit `-c` is refused before the first point runs (a long bench
/// used to fail only when it reached that point, losing the figures before it).
#[test]
fn bench_decode_refuses_context_lengths_beyond_c_up_front() {
    if common::gpu().is_none() {
        return;
    }
    let m = tiny_model();
    let out = Command::new(env!("CARGO_BIN_EXE_kvrun"))
        .args(["bench", "decode", "-m", &m, "-c", "64", "--context-lengths", "16,64"])
        .args(["--decode-tokens", "4", "--timed-steps", "2", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--context-lengths 64") && err.contains("raise -c to at least 69"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no point ran: {}", String::from_utf8_lossy(&out.stdout));
}

/// The tiny Llama as a Mistral with window 11 (one sliding group): the KV it holds stops
/// growing with the context. In 512-token chunks a sequence holds at most
/// ceil((10 + chunk) / 16) + 1 blocks; past the window and the prompt chunk, that is flat.
#[test]
fn bench_decode_sliding_window_kv_is_flat_past_the_window() {
    if common::gpu().is_none() {
        return;
    }
    let m = format!("{}/assets/tiny-llama/hf-window", env!("CARGO_MANIFEST_DIR"));
    let r = json(&[
        "bench",
        "decode",
        "-m",
        &m,
        "--context-lengths",
        "8,64,120",
        "--decode-tokens",
        "4",
        "--timed-steps",
        "2",
        "--max-num-batched-tokens",
        "16",
        "--json",
    ]);
    let by_group: Vec<Vec<u64>> = r["points"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            p["kv_bytes_by_group"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect()
        })
        .collect();
    // One sliding group; 16-token chunks: ceil((10 + 16) / 16) + 1 = 3 blocks of 16 × 256 bytes.
    assert!(by_group.iter().all(|g| g.len() == 1), "{by_group:?}");
    // (Chunks aligned to the blocks need one block less: 2.)
    assert!(by_group.iter().all(|g| g[0] <= 3 * 16 * 256), "{by_group:?}");
    assert_eq!(by_group[2][0], by_group[1][0], "flat past the window: {by_group:?}");
    // Full attention would hold ceil(126 / 16) = 8 blocks at context 120.
    assert!(by_group[2][0] < 8 * 16 * 256, "{by_group:?}");
}

#[test]
fn bench_kv_quant_compares_formats() {
    if common::gpu().is_none() {
        return;
    }
    let (m, f) = (tiny_model(), text());
    let r = json(&[
        "bench",
        "kv-quant",
        "-m",
        &m,
        "-f",
        &f,
        "--settings",
        "f16,int8,int4",
        "--chunks",
        "1",
        "-c",
        "64",
        "--context-lengths",
        "32",
        "--timed-steps",
        "2",
        "--rounds",
        "2",
        "--json",
    ]);
    assert_eq!(r["rounds"].as_u64(), Some(2));
    let rows = r["rows"].as_array().unwrap();
    let names: Vec<&str> = rows.iter().map(|x| x["kv_cache_dtype"].as_str().unwrap()).collect();
    assert_eq!(names, ["f16", "int8", "int4"]);
    let (f16, int8, int4) = (&rows[0], &rows[1], &rows[2]);
    assert_eq!((num(&f16["ppl_delta_pct"]), num(&f16["kld_mean"])), (0.0, 0.0));
    assert_eq!(num(&f16["kv_bytes_per_token"]), 256.0);
    assert!(num(&int8["kv_bytes_per_token"]) < 256.0);
    assert!(num(&int4["kv_bytes_per_token"]) < num(&int8["kv_bytes_per_token"]));
    assert!(num(&int8["kld_mean"]) > 0.0, "int8 is not bit-identical to f16");
    assert!(num(&int4["kld_mean"]) > num(&int8["kld_mean"]), "4 bits lose more than 8");
    for row in rows {
        assert!(row["ppl"].as_f64().is_some_and(f64::is_finite));
        let t = row["attention_gpu_ms_per_token"].as_array().unwrap();
        assert!(t.len() == 1 && num(&t[0]) > 0.0, "{row}");
        // Two rounds per context length; the reported time is their median (of two: the mean).
        let by_round = row["attention_gpu_ms_by_round"].as_array().unwrap();
        assert_eq!(by_round.len(), 1, "{row}");
        let runs: Vec<f64> = by_round[0].as_array().unwrap().iter().map(num).collect();
        assert_eq!(runs.len(), 2, "{row}");
        assert!(runs.iter().all(|&x| x > 0.0), "{row}");
        let mean = (runs[0] + runs[1]) / 2.0;
        assert!((num(&t[0]) - mean).abs() <= 1e-9 * mean, "{row}");
        // GB/s follows the median time and the KV bytes read.
        let bytes = num(&row["attention_kv_bytes_per_step"][0]);
        let gb_s = num(&row["attention_gb_s"][0]);
        assert!((gb_s - bytes / (num(&t[0]) * 1e6)).abs() <= 1e-9 * gb_s, "{row}");
    }
}

/// Without XDG_RUNTIME_DIR (a container, a service) Mesa's drivers would print "XDG_RUNTIME_DIR
/// is invalid or not set" once per window-system probe; kvrun points it at a private directory
/// of its own first, so a run's stderr is only kvrun's.
#[test]
fn no_mesa_runtime_dir_warnings() {
    if common::gpu().is_none() {
        return;
    }
    let out = Command::new(env!("CARGO_BIN_EXE_kvrun"))
        .args(["generate", "-m", &tiny_model(), "-p", "hi", "-n", "2"])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("XDG_RUNTIME_DIR"), "{stderr}");
}

/// `--chat-template-file` replaces the model's template (a shorter one: fewer prompt tokens);
/// a missing file is named.
#[test]
fn chat_template_file_replaces_the_models() {
    if common::gpu().is_none() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("kvrun-template-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t.jinja");
    std::fs::write(&file, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
    let model = tiny_model();
    let run = |extra: &[&str]| {
        let mut args = vec!["generate", "-m", model.as_str(), "-p", "hi", "-n", "1", "--json"];
        args.extend(extra);
        json(&args)["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let own = run(&[]);
    let replaced = run(&["--chat-template-file", file.to_str().unwrap()]);
    assert!(replaced < own, "{replaced} vs {own}");
    let out = Command::new(env!("CARGO_BIN_EXE_kvrun"))
        .args([
            "generate",
            "-m",
            &tiny_model(),
            "-p",
            "hi",
            "--chat-template-file",
            "/nonexistent.jinja",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("--chat-template-file /nonexistent.jinja"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
