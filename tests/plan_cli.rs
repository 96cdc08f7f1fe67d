//! `kvrun plan` through the built binary: the KV arithmetic of DESIGN.md on the HF configs in
//! `assets/configs/`, the stable `--json` keys, the real GGUF (when fetched) and bad input.
//! Needs no GPU.

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn config(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/configs").join(name).join("config.json")
}

fn kvrun(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvrun"))
        .args(args)
        .env_remove("KVRUN_MODEL")
        .output()
        .expect("run the kvrun binary")
}

/// `kvrun plan -m MODEL --json EXTRA…`, parsed; panics with stderr when it fails.
fn plan_json(model: &std::path::Path, extra: &[&str]) -> Value {
    let model = model.to_str().unwrap();
    let mut args = vec!["plan", "-m", model, "--json"];
    args.extend_from_slice(extra);
    let out = kvrun(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kvrun {args:?} failed: {stderr}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("kvrun {args:?}: stdout is not one JSON object ({e})"))
}

/// `kvrun plan …` expected to fail: returns stderr after checking the exit code and no panic.
fn plan_fails(args: &[&str]) -> String {
    let mut all = vec!["plan"];
    all.extend_from_slice(args);
    let out = kvrun(&all);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "kvrun {all:?} succeeded: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!stderr.contains("panicked"), "kvrun {all:?} panicked: {stderr}");
    assert!(stderr.starts_with("error: "), "kvrun {all:?}: {stderr}");
    stderr
}

fn u(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} is not an integer in {v}"))
}

/// The keys DESIGN.md ("Machine-readable output") promises for `plan --json`.
const STABLE_KEYS: [&str; 8] = [
    "kv_bytes_per_token",
    "kv_bytes_per_block",
    "kv_bytes_per_sequence",
    "kv_tokens_fit",
    "sequences_fit",
    "weight_bytes",
    "block_size",
    "kv_cache_dtype",
];

#[test]
fn every_config_has_the_stable_json_keys() {
    let names = [
        "llama-2-7b",
        "llama-3-8b",
        "mistral-7b-v0.1",
        "smollm2-135m",
        "gemma-3-270m",
        "gemma-3-4b-it",
        "gemma-3-27b-it",
        "deepseek-v2-lite",
        "deepseek-v3",
        "qwen3-0.6b",
        "qwen3-8b",
        "qwen3.5-9b-shape",
        "gemma-4-31b-shape",
        "qwen3-30b-a3b-shape",
        "gpt-oss-20b-shape",
    ];
    for name in names {
        let p = plan_json(&config(name), &[]);
        for key in STABLE_KEYS {
            assert!(p.get(key).is_some(), "{name}: missing {key} in {p}");
        }
        assert_eq!(p["kv_cache_dtype"], "f16", "{name}");
        assert_eq!(u(&p, "block_size"), 16, "{name}");
        // A block belongs to one KV-cache group; a token costs a block's share in every group.
        let groups = p["kv_groups"].as_array().unwrap().len() as u64;
        assert_eq!(
            groups * u(&p, "kv_bytes_per_block"),
            16 * u(&p, "kv_bytes_per_token"),
            "{name}"
        );
    }
}

/// Qwen3.5-9B's shape (transformers' `Qwen3_5TextConfig` defaults): only its 8 attention layers
/// of 32 keep KV, 8 × 4 KV heads × 256 × 2 (K, V) × 2 bytes = 32 KiB a token in one group of 8
/// slots; its 24 Gated DeltaNet layers keep per sequence a conv state (3 × 8,192 f32) and a
/// recurrent state (32 × 128 × 128 f32): 24 × (96 KiB + 2 MiB) = 50.25 MiB, whatever `-c`;
/// 8,953,803,264 parameters (transformers counts them so) in bf16.
#[test]
fn qwen35_hybrid_figures() {
    let c = config("qwen3.5-9b-shape");
    let p = plan_json(&c, &["-c", "32768", "--max-num-seqs", "4"]);
    assert_eq!(u(&p, "kv_bytes_per_token"), 32 * KIB);
    assert_eq!(u(&p, "kv_bytes_per_sequence"), GIB);
    let groups = p["kv_groups"].as_array().unwrap();
    assert_eq!((groups.len(), u(&groups[0], "layers")), (1, 8));
    assert_eq!(u(&p, "kv_padding_slots"), 0);
    assert_eq!(u(&p, "state_layers"), 24);
    let state = 24 * (3 * 8192 * 4 + 32 * 128 * 128 * 4);
    assert_eq!(u(&p, "state_bytes_per_sequence"), state);
    assert_eq!(u(&p, "state_bytes_needed"), 4 * state);
    // snapshots for prefix reuse: 2 per sequence by default, as asked otherwise
    assert_eq!((u(&p, "state_snapshots"), u(&p, "state_snapshot_bytes")), (8, 8 * state));
    let few = plan_json(&c, &["-c", "32768", "--state-snapshots", "3"]);
    assert_eq!(u(&few, "state_snapshot_bytes"), 3 * state);
    assert_eq!(u(&p, "weight_bytes"), 8_953_803_264 * 2);
    let short = plan_json(&c, &["-c", "1024"]);
    assert_eq!(u(&short, "state_bytes_per_sequence"), state, "states do not grow with -c");
    // an attention-only model has none
    let qwen3 = plan_json(&config("qwen3-8b"), &[]);
    assert_eq!((u(&qwen3, "state_layers"), u(&qwen3, "state_bytes_needed")), (0, 0));
}

/// Gemma 4's 31B shape: 50 sliding layers of 16 KV heads × 256 and 10 global layers of 4 ×
/// 512 (K = V still caches K and V): 50 × 16 × 256 × 2 × 2 + 10 × 4 × 512 × 2 × 2 = 901,120
/// bytes a token with the global layers packed two to a slot (blocks of 5 slots sized for
/// 16 × 256, 1.25 MiB: 10 sliding groups and 1 full, no padding). At `-c 8192` (windows of
/// 1024) each sliding group holds at most 97 blocks, the full group 512. Both head shapes are
/// listed with their use of the pool.
#[test]
fn gemma4_two_head_shapes_share_the_pool_without_padding() {
    let p = plan_json(&config("gemma-4-31b-shape"), &["-c", "8192"]);
    assert_eq!(u(&p, "kv_bytes_per_token"), 50 * 16 * 256 * 4 + 10 * 4 * 512 * 4);
    assert_eq!(u(&p, "kv_bytes_per_block"), 5 * 16 * 256 * 4 * 16);
    let groups = p["kv_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 11);
    let full: Vec<&Value> = groups.iter().filter(|g| g["kind"] == "full").collect();
    assert_eq!((full.len(), u(full[0], "layers"), u(full[0], "blocks_per_sequence")), (1, 10, 512));
    assert_eq!(u(&p, "kv_padding_slots"), 0);
    let per_block = u(&p, "kv_bytes_per_block");
    assert_eq!(u(&p, "kv_bytes_per_sequence"), (10 * 97 + 512) * per_block);
    let shapes = p["kv_head_shapes"].as_array().unwrap();
    let shape = |i: usize| {
        let s = &shapes[i];
        (
            u(s, "kv_heads"),
            u(s, "head_dim"),
            u(s, "layers"),
            u(s, "pool_heads"),
            u(s, "layers_per_slot"),
        )
    };
    assert_eq!((shape(0), shape(1)), ((16, 256, 50, 16, 1), (4, 512, 10, 8, 2)));
    let text = kvrun(&["plan", "-m", config("gemma-4-31b-shape").to_str().unwrap(), "-c", "8192"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("heads 4×512") && text.contains("2 a slot of 8 such heads (100 % used)"),
        "{text}"
    );
    // per-token V scales do not divide between the shapes: refused, naming the fix
    let err = plan_fails(&[
        "-m",
        config("gemma-4-31b-shape").to_str().unwrap(),
        "--kv-cache-dtype",
        "int8",
    ]);
    assert!(err.contains("per-channel scales for K and V"), "{err}");
    let channel = plan_json(
        &config("gemma-4-31b-shape"),
        &["--kv-cache-dtype", "int8", "--kv-v-scale", "per-channel"],
    );
    assert_eq!(channel["kv_head_shapes"].as_array().unwrap().len(), 2);
}

/// DESIGN.md: 32 layers × 32 KV heads × 128 × 2 (K, V) × 2 bytes = 512 KiB a token; 4096 tokens
/// = 2 GiB; 8 such sequences = 16 GiB.
#[test]
fn llama_2_7b_figures() {
    let c = config("llama-2-7b");
    let one = plan_json(&c, &[]);
    assert_eq!(u(&one, "kv_bytes_per_token"), 524_288);
    assert_eq!(u(&one, "kv_bytes_per_token"), 512 * KIB);
    assert_eq!(u(&one, "kv_bytes_per_block"), 8 * MIB);
    // -c defaults to the model's 4096 positions.
    assert_eq!(u(&one, "max_model_len"), 4096);
    assert_eq!(u(&one, "kv_bytes_per_sequence"), 2 * GIB);
    // 6,738,415,616 parameters in float16.
    assert_eq!(u(&one, "weight_bytes"), 6_738_415_616 * 2);

    let eight = plan_json(&c, &["-c", "4096", "--max-num-seqs", "8"]);
    assert_eq!(u(&eight, "kv_bytes_per_sequence"), 2 * GIB);
    assert_eq!(u(&eight, "kv_bytes_needed"), 16 * GIB);
    assert_eq!(u(&eight, "kv_cache_memory"), 16 * GIB);
    assert_eq!(u(&eight, "kv_tokens_fit"), 8 * 4096);
    assert_eq!(u(&eight, "sequences_fit"), 8);

    // 6 GiB hold 768 blocks of 8 MiB = 12,288 tokens = 3 whole 4096-token sequences.
    let budget = plan_json(&c, &["--max-num-seqs", "8", "--kv-cache-memory", "6GiB"]);
    assert_eq!(u(&budget, "kv_tokens_fit"), 12_288);
    assert_eq!(u(&budget, "sequences_fit"), 3);
    // -c 1000 rounds up to 63 blocks (1008 tokens) a sequence: 768 / 63 = 12 sequences.
    let short = plan_json(&c, &["-c", "1000", "--kv-cache-memory", "6GiB"]);
    assert_eq!(u(&short, "kv_bytes_per_sequence"), 63 * 8 * MIB);
    assert_eq!(u(&short, "sequences_fit"), 12);
    // Twice the block size: twice the bytes a block, same bytes a token.
    let big_blocks = plan_json(&c, &["--block-size", "32"]);
    assert_eq!(u(&big_blocks, "kv_bytes_per_block"), 16 * MIB);
    assert_eq!(u(&big_blocks, "kv_bytes_per_token"), 512 * KIB);
}

#[test]
fn llama_2_7b_text_warns_when_the_budget_is_short() {
    let c = config("llama-2-7b");
    let out = kvrun(&[
        "plan",
        "-m",
        c.to_str().unwrap(),
        "--max-num-seqs",
        "8",
        "--kv-cache-memory",
        "6GiB",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("512 KiB"), "{text}");
    assert!(text.contains("12288 tokens in 768 blocks = 3 full sequences"), "{text}");
    assert!(text.contains("only 3 of 8 full-length sequences fit"), "{text}");
    assert!(text.contains("raise --kv-cache-memory to 16 GiB"), "{text}");
}

/// GQA with 8 KV heads: 32 × 8 × 128 × 2 × 2 = 128 KiB a token.
#[test]
fn llama_3_8b_figures() {
    let c = config("llama-3-8b");
    let p = plan_json(&c, &[]);
    assert_eq!(u(&p, "kv_bytes_per_token"), 131_072);
    assert_eq!(u(&p, "max_model_len"), 8192);
    assert_eq!(u(&p, "kv_bytes_per_sequence"), GIB);
    // 8,030,261,248 parameters in bfloat16 (untied 128,256-row embedding and head).
    assert_eq!(u(&p, "weight_bytes"), 8_030_261_248 * 2);
    let budget = plan_json(&c, &["--kv-cache-memory", "24GiB", "--max-num-seqs", "32"]);
    assert_eq!(u(&budget, "kv_tokens_fit"), 24 * GIB / (128 * KIB));
    assert_eq!(u(&budget, "sequences_fit"), 24);
    assert_eq!(u(&budget, "kv_bytes_needed"), 32 * GIB);
}

/// Qwen3-8B: 36 layers × 8 KV heads × 128 × 2 (K, V) × 2 bytes = 144 KiB a token, one full
/// group; 8,190,735,360 parameters in bfloat16 (untied 151,936-row embedding and head, each
/// layer's Q/K norms 2 × 128). Qwen3-0.6B: 28 × 8 × 128 × 2 × 2 = 112 KiB a token (16 query
/// heads × 128 = 2048 ≠ hidden 1024), 596,049,920 parameters with the tied embedding.
#[test]
fn qwen3_figures() {
    let p = plan_json(&config("qwen3-8b"), &["-c", "8192"]);
    assert_eq!(u(&p, "kv_bytes_per_token"), 147_456);
    assert_eq!(p["kv_groups"].as_array().unwrap().len(), 1);
    assert_eq!(u(&p, "kv_bytes_per_sequence"), 8192 * 147_456);
    assert_eq!(u(&p, "weight_bytes"), 8_190_735_360 * 2);
    let p = plan_json(&config("qwen3-0.6b"), &["-c", "8192"]);
    assert_eq!(u(&p, "kv_bytes_per_token"), 114_688);
    assert_eq!(u(&p, "weight_bytes"), 596_049_920 * 2);
}

/// Qwen3-30B-A3B's shape: 48 layers × 4 KV heads × 128 × 2 × 2 = 96 KiB a token; 30,532,122,624
/// parameters in bf16 (transformers' count), of which a token reads 3,353,032,704: all but
/// 120 of every layer's 128 experts (48 × 128 × 3 × 768 × 2048 expert parameters). A dense
/// model reads all its weights.
#[test]
fn qwen3_moe_figures() {
    let p = plan_json(&config("qwen3-30b-a3b-shape"), &["-c", "8192"]);
    assert_eq!(u(&p, "kv_bytes_per_token"), 96 * KIB);
    assert_eq!(u(&p, "weight_bytes"), 30_532_122_624 * 2);
    let experts: u64 = 48 * 128 * 3 * 768 * 2048;
    assert_eq!(u(&p, "active_weight_bytes"), (30_532_122_624 - experts / 128 * 120) * 2);
    assert_eq!(u(&p, "active_weight_bytes"), 3_353_032_704 * 2);
    let dense = plan_json(&config("qwen3-8b"), &["-c", "8192"]);
    assert_eq!(u(&dense, "active_weight_bytes"), u(&dense, "weight_bytes"));
}

/// gpt-oss-20b's shape: 20,914,757,184 parameters (the published "21B": biases and attention
/// sinks included), 19,110,297,600 of them expert weights (24 × 32 × 3 × 2880 × 2880) held in
/// MXFP4 (17 bytes a block of 32: 10,152,345,600 bytes) and the rest in bf16 — 13,761,264,768
/// bytes, the size of its published checkpoint; a token reads 4 of the 32 experts. KV: 24
/// layers × 8 × 64 × 2 × 2 = 48 KiB a token, the 12 sliding layers in their own group.
#[test]
fn gpt_oss_20b_figures() {
    let p = plan_json(&config("gpt-oss-20b-shape"), &["-c", "8192"]);
    assert_eq!(u(&p, "kv_bytes_per_token"), 48 * KIB);
    assert_eq!(p["kv_groups"].as_array().unwrap().len(), 2);
    let experts: u64 = 24 * 32 * 3 * 2880 * 2880;
    let expert_bytes = experts / 32 * 17;
    let rest = (20_914_757_184 - experts) * 2;
    assert_eq!(u(&p, "weight_bytes"), rest + expert_bytes);
    assert_eq!(u(&p, "weight_bytes"), 13_761_264_768);
    assert_eq!(u(&p, "active_weight_bytes"), rest + expert_bytes / 32 * 4);
}

/// Same KV shape as Llama-3-8B. At -c 4096 the 4096-token window covers the context (one full
/// group, as Llama-3-8B); past it the one sliding group holds the window before a 512-token
/// chunk and the chunk: ceil((4095 + 512) / 16) + 1 = 289 blocks of 2 MiB, whatever -c.
#[test]
fn mistral_7b_v0_1_figures() {
    let c = config("mistral-7b-v0.1");
    let within = plan_json(&c, &["-c", "4096", "--max-num-seqs", "8"]);
    assert_eq!(u(&within, "kv_bytes_per_token"), 131_072);
    assert_eq!(u(&within, "kv_bytes_per_sequence"), 512 * MIB);
    assert_eq!(u(&within, "kv_bytes_needed"), 4 * GIB);
    assert_eq!(within["kv_groups"][0]["kind"], "full");
    // 7,241,732,096 parameters in bfloat16.
    assert_eq!(u(&within, "weight_bytes"), 7_241_732_096 * 2);

    let long = plan_json(&c, &["-c", "32768", "--kv-cache-memory", "6GiB"]);
    assert_eq!(u(&long, "max_model_len"), 32_768);
    let group = &long["kv_groups"][0];
    assert_eq!((group["kind"].as_str(), u(group, "window")), (Some("sliding"), 4096));
    assert_eq!(u(group, "blocks_per_sequence"), 289);
    assert_eq!(u(&long, "kv_bytes_per_sequence"), 289 * 2 * MIB);
    assert_eq!(u(&long, "kv_bytes_per_sequence_full_attention"), 4 * GIB);
    assert_eq!(u(&long, "kv_tokens_fit"), 6 * GIB / (128 * KIB));
    assert_eq!(u(&long, "sequences_fit"), 3072 / 289);
    // Decode-sized steps hold one block less than the window's 256 + 2.
    let decode = plan_json(&c, &["-c", "32768", "--max-num-batched-tokens", "1"]);
    assert_eq!(u(&decode["kv_groups"][0], "blocks_per_sequence"), 257);

    let out = kvrun(&["plan", "-m", c.to_str().unwrap(), "-c", "32768"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("sliding window 4096, 32 layers, 289 blocks at most"), "{text}");
}

/// Gemma 3 270M: 18 layers (every 6th global), 1 KV head × 256, window 512. Groups of 3 layer
/// slots: 1 full + 5 sliding, no padding; a block is 3 × 16 × 256 × 2 × 2 = 48 KiB, a token
/// 18 × 256 × 2 × 2 = 18 KiB. At -c 8192 with 512-token chunks a sequence holds 512 blocks in
/// the full group and 65 in each sliding one: 837 of the 3072 full attention would take (27 %).
#[test]
fn gemma_3_270m_figures() {
    let c = config("gemma-3-270m");
    let p = plan_json(&c, &["-c", "8192"]);
    assert_eq!(u(&p, "kv_bytes_per_block"), 49_152);
    assert_eq!(u(&p, "kv_bytes_per_token"), 18_432);
    assert_eq!(u(&p, "kv_padding_slots"), 0);
    let groups = p["kv_groups"].as_array().unwrap();
    let kinds: Vec<_> = groups.iter().map(|g| g["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["sliding", "sliding", "sliding", "sliding", "sliding", "full"]);
    assert!(groups.iter().all(|g| u(g, "layers") == 3));
    assert_eq!(u(&groups[0], "blocks_per_sequence"), 65);
    assert_eq!(u(&groups[5], "blocks_per_sequence"), 512);
    assert_eq!(u(&p, "kv_bytes_per_sequence"), 837 * 49_152);
    assert_eq!(u(&p, "kv_bytes_per_sequence_full_attention"), 6 * 512 * 49_152);
    // Within the window every group is full attention: one group of all 18 layers.
    let short = plan_json(&c, &["-c", "512"]);
    assert_eq!(short["kv_groups"].as_array().unwrap().len(), 1);
    assert_eq!(u(&short, "kv_bytes_per_sequence"), 32 * 18 * 16 * 1024);
}

/// MLA caches one latent (kv_lora_rank 512) and one shared RoPE key (64) per token and layer,
/// for all heads: DeepSeek-V2-Lite 27 × 576 × 2 = 31,104 bytes per token in f16, DeepSeek-V3
/// 61 × 576 × 2 = 70,272. Beside it, the same heads as plain per-head K (128 + 64) and V (128):
/// 27 × 16 × 320 × 2 = 276,480 and 61 × 128 × 320 × 2 = 4,997,120. Both have mixture-of-experts
/// layers: `plan` sizes them and their weights, quantized latent KV is refused by name.
#[test]
fn deepseek_mla_figures() {
    for (name, layers, token, expanded) in
        [("deepseek-v2-lite", 27u64, 31_104u64, 276_480u64), ("deepseek-v3", 61, 70_272, 4_997_120)]
    {
        let p = plan_json(&config(name), &["-c", "4096"]);
        assert_eq!(u(&p, "kv_bytes_per_token"), token, "{name}");
        assert_eq!(token, layers * 576 * 2, "{name}");
        assert_eq!(u(&p, "kv_bytes_per_block"), 16 * token, "{name}");
        assert_eq!(u(&p, "kv_bytes_per_token_expanded"), expanded, "{name}");
        assert_eq!(u(&p, "kv_bytes_per_sequence"), 4096 * token, "{name}");
        assert_eq!(p["kv_groups"].as_array().unwrap().len(), 1, "{name}");
        let text = kvrun(&["plan", "-m", config(name).to_str().unwrap(), "-c", "4096"]);
        let out = String::from_utf8_lossy(&text.stdout).to_string();
        assert!(out.contains("expanded") && out.contains("per token if MLA"), "{out}");
    }
    // V2-Lite's weights: 15,706,484,224 parameters ("15.7B"), of which a token reads
    // 2,661,150,208: the 6 of 64 routed experts (26 layers of 64 × 3 × 1408 × 2048) beside its
    // 2 shared ones; V3's 671,026,404,352 ("671B"), of which a token reads 37,552,282,624
    // ("37B activated"): 8 of 256 routed experts in 58 layers of 256 × 3 × 2048 × 7168
    let lite = plan_json(&config("deepseek-v2-lite"), &["-c", "4096"]);
    assert_eq!(u(&lite, "weight_bytes"), 15_706_484_224 * 2);
    let routed: u64 = 26 * 64 * 3 * 1408 * 2048;
    assert_eq!(u(&lite, "active_weight_bytes"), (15_706_484_224 - routed / 64 * 58) * 2);
    let v3 = plan_json(&config("deepseek-v3"), &["-c", "4096"]);
    assert_eq!(u(&v3, "weight_bytes"), 671_026_404_352 * 2);
    let routed: u64 = 58 * 256 * 3 * 2048 * 7168;
    assert_eq!(u(&v3, "active_weight_bytes"), 37_552_282_624 * 2);
    assert_eq!(671_026_404_352 - routed / 256 * 248, 37_552_282_624);
    // no expanded figure for other attention
    assert!(plan_json(&config("llama-3-8b"), &[]).get("kv_bytes_per_token_expanded").is_none());
    // A quantized latent is one code read as keys and as values: one granularity for both.
    let v3 = config("deepseek-v3");
    let err = plan_fails(&["-m", v3.to_str().unwrap(), "--kv-cache-dtype", "int8"]);
    assert!(err.contains("MLA latent") && err.contains("--kv-k-scale per-token"), "{err}");
    let int8 = ["-c", "4096", "--kv-cache-dtype", "int8", "--kv-k-scale", "per-token"];
    let p = plan_json(&v3, &[&int8[..], &["--kv-v-scale", "per-token"]].concat());
    // per layer a block is 16 × 576 int8 codes + 16 f16 scales (8 words): 9,248 bytes
    assert_eq!(u(&p, "kv_bytes_per_block"), 61 * 9_248);
    assert_eq!(u(&p, "kv_bytes_per_token"), 61 * 578);
}

/// Gemma 3 4B (34 layers, 5 global, window 1024, 4 KV heads × 256) and 27B (62 layers, 10
/// global, 16 KV heads × 128): the group sizes of kv/groups.rs, padding weighed in bytes (a
/// full group's padding slot costs the whole context's blocks, a sliding group's 97) and kept
/// within 1 % of what the layers need. At `-c 8192` the 4B's 5 slots would leave one sliding
/// slot empty (97 of 5,373 slot-blocks, 1.8 %): blocks of 1 slot, 34 groups, no padding; the
/// 27B's 5 would leave 3 (2.9 %): blocks of 2, 5 full + 26 sliding groups. At `-c 32768` the
/// 27B keeps blocks of 2 (s = 10 would pad 3.0 %, s = 5 1.1 %): its 3.12 GiB a sequence is
/// exactly what its layers need.
#[test]
fn gemma_3_4b_and_27b_groups() {
    let cases: [(&str, u64, u64, u64, u64, u64, u64); 2] =
        [("gemma-3-4b-it", 1, 5, 29, 0, 4, 256), ("gemma-3-27b-it", 2, 5, 26, 0, 16, 128)];
    for (name, slots, full, sliding, padding, kv_heads, head_dim) in cases {
        let p = plan_json(&config(name), &["-c", "8192"]);
        let groups = p["kv_groups"].as_array().unwrap();
        let count = |kind: &str| groups.iter().filter(|g| g["kind"] == kind).count() as u64;
        assert_eq!((count("full"), count("sliding")), (full, sliding), "{name}");
        assert_eq!(u(&p, "kv_padding_slots"), padding, "{name}");
        assert_eq!(u(&p, "kv_bytes_per_block"), slots * kv_heads * 16 * head_dim * 4, "{name}");
        // Full group: 512 blocks; sliding: ceil((1023 + 512) / 16) + 1 = 97.
        let blocks = full * 512 + sliding * 97;
        assert_eq!(u(&p, "kv_bytes_per_sequence"), blocks * u(&p, "kv_bytes_per_block"), "{name}");
        // the padding is in the sliding groups: 97 blocks of a slot each
        let slot_bytes = u(&p, "kv_bytes_per_block") / slots;
        assert_eq!(u(&p, "kv_padding_bytes_per_sequence"), padding * 97 * slot_bytes, "{name}");
        let needed = u(&p, "kv_bytes_per_sequence") - u(&p, "kv_padding_bytes_per_sequence");
        assert!(u(&p, "kv_padding_bytes_per_sequence") * 100 <= needed, "{name}: at most 1 %");
    }
    let p = plan_json(&config("gemma-3-27b-it"), &["-c", "32768"]);
    assert_eq!(p["kv_groups"].as_array().unwrap().len(), 31);
    assert_eq!(u(&p, "kv_padding_slots"), 0);
    let slot_bytes = 16 * 16 * 128 * 4;
    assert_eq!(u(&p, "kv_padding_bytes_per_sequence"), 0);
    // what its layers need: 10 layers × 2048 blocks, 52 × 97 (3.12 GiB)
    let needed = (10 * 2048 + 52 * 97) * slot_bytes;
    assert_eq!(u(&p, "kv_bytes_per_sequence"), needed);
    assert_eq!(needed, 3_345_481_728);
    // Quantized KV stages each sequence's partial last block of K and V in f16, per model layer
    // (padding slots have none; `engine::kv_storage`). 4B: 34 layers × 4 KV heads × 16 tokens ×
    // 256 × 2 bytes × K and V (36 slots would give 2,359,296).
    let p = plan_json(&config("gemma-3-4b-it"), &["-c", "8192", "--kv-cache-dtype", "int8"]);
    assert_eq!(u(&p, "kv_staging_bytes_per_sequence"), 34 * 4 * 16 * 256 * 2 * 2);
}

/// DESIGN.md: 30 layers × 3 KV heads × 64 × 2 × 2 = 23,040 bytes = 22.5 KiB a token.
#[test]
fn smollm2_135m_figures() {
    let c = config("smollm2-135m");
    let p = plan_json(&c, &[]);
    assert_eq!(u(&p, "kv_bytes_per_token"), 23_040);
    assert_eq!(u(&p, "kv_bytes_per_block"), 368_640);
    assert_eq!(u(&p, "max_model_len"), 8192);
    assert_eq!(u(&p, "kv_bytes_per_sequence"), 180 * MIB);
    // 134,515,008 parameters in bfloat16 (tied embeddings: one 49,152-row matrix).
    assert_eq!(u(&p, "weight_bytes"), 134_515_008 * 2);
    // 1 GiB: floor(2^30 / 368,640) = 2912 blocks = 46,592 tokens = 5 sequences of 8192.
    let budget = plan_json(&c, &["--kv-cache-memory", "1GiB"]);
    assert_eq!(u(&budget, "kv_tokens_fit"), 46_592);
    assert_eq!(u(&budget, "sequences_fit"), 5);
    // -c 100 needs 7 blocks (112 tokens) a sequence; 4 sequences need 28 blocks.
    let short = plan_json(&c, &["-c", "100", "--max-num-seqs", "4"]);
    assert_eq!(u(&short, "kv_bytes_per_sequence"), 7 * 368_640);
    assert_eq!(u(&short, "kv_tokens_fit"), 448);
    assert_eq!(u(&short, "sequences_fit"), 4);
}

/// On the GGUF itself `weight_bytes` is the file's tensor bytes, not an estimate.
#[test]
fn real_gguf_weight_bytes_are_the_tensor_bytes() {
    let Some(path) = common::real_model("real_gguf_weight_bytes_are_the_tensor_bytes") else {
        return;
    };
    let file = kvrun::loader::ModelFile::open(&path).unwrap();
    let tensor_bytes: u64 =
        file.tensor_names().iter().map(|name| file.tensor(name).unwrap().data.len() as u64).sum();
    assert_eq!(tensor_bytes, 96_576_768); // 272 tensors, as gguf-py counts them
    let p = plan_json(&path, &[]);
    assert_eq!(u(&p, "weight_bytes"), tensor_bytes);
    assert_eq!(u(&p, "kv_bytes_per_token"), 23_040);
    assert_eq!(u(&p, "kv_bytes_per_sequence"), 180 * MIB);
}

#[test]
fn bad_model_paths_are_named() {
    let err = plan_fails(&["-m", "/nonexistent/config.json"]);
    let lower = err.to_lowercase();
    assert!(err.contains("/nonexistent/config.json") && lower.contains("no such file"), "{err}");
    assert_eq!(lower.matches("no such file").count(), 1, "the reason is printed once: {err}");
    let err = plan_fails(&["-m", "/nonexistent/model.gguf"]);
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
}

#[test]
fn files_that_are_not_models_are_refused() {
    let dir = std::env::temp_dir().join(format!("kvrun-plan-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let not_json = dir.join("config.json");
    std::fs::write(&not_json, "this is not JSON\n").unwrap();
    let err = plan_fails(&["-m", not_json.to_str().unwrap()]);
    assert!(err.contains("config.json is not"), "{err}");

    let not_gguf = dir.join("notes.txt");
    std::fs::write(&not_gguf, "hello, world\n").unwrap();
    let err = plan_fails(&["-m", not_gguf.to_str().unwrap()]);
    assert!(err.contains("not a GGUF file"), "{err}");

    let gpt2 = dir.join("gpt2.json");
    std::fs::write(
        &gpt2,
        r#"{"architectures": ["GPT2LMHeadModel"], "hidden_size": 768, "intermediate_size": 3072,
            "num_hidden_layers": 12, "num_attention_heads": 12, "vocab_size": 50257}"#,
    )
    .unwrap();
    let err = plan_fails(&["-m", gpt2.to_str().unwrap()]);
    assert!(err.contains("'GPT2LMHeadModel' is not supported"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_targets_name_the_flag() {
    let c = config("llama-2-7b");
    let c = c.to_str().unwrap();
    let err = plan_fails(&["-m", c, "--kv-cache-memory", "1KiB"]);
    assert!(err.contains("--kv-cache-memory") && err.contains("holds no block"), "{err}");
    let err = plan_fails(&["-m", c, "--kv-cache-memory", "lots"]);
    assert!(err.contains("invalid byte size \"lots\""), "{err}");
    let err = plan_fails(&["-m", c, "-c", "0"]);
    assert!(err.contains("-c/--max-model-len"), "{err}");
    let err = plan_fails(&["-m", c, "--max-num-seqs", "0"]);
    assert!(err.contains("--max-num-seqs"), "{err}");
}
