//! `ModelFile::open` refuses a file whose config and tensors disagree, and a tokenizer larger
//! than the embedding, before anything is sized from the config; odd paths are reported as
//! what they are. The inputs are the tiny model's GGUF rewritten with one thing changed.

use kvrun::loader::{GgufFile, GgufValue, GgufWriter, LoadError, ModelFile};
use std::path::{Path, PathBuf};

fn tiny() -> GgufFile {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-llama/tiny-llama-f32.gguf");
    GgufFile::open(&path).unwrap()
}

/// A path for a rewritten file in cargo's per-target temp folder (inside `target/`, so a run
/// leaves nothing in the system's temp dir; each run overwrites the last one's files).
fn temp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("loader_model_check");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// The tiny GGUF with metadata `overrides` (replaced or added), without the tensors `drop`, and with tensor rows
/// cut to `rows` where given (name, rows); written to a temp file.
fn rewrite(
    name: &str,
    overrides: &[(&str, GgufValue)],
    drop: &[&str],
    cut: &[(&str, usize)],
) -> PathBuf {
    rewrite_from(&tiny(), name, overrides, drop, cut)
}

/// [`rewrite`] of another GGUF.
fn rewrite_from(
    src: &GgufFile,
    name: &str,
    overrides: &[(&str, GgufValue)],
    drop: &[&str],
    cut: &[(&str, usize)],
) -> PathBuf {
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if !overrides.iter().any(|(o, _)| *o == k) {
            w.add(k, v.clone());
        }
    }
    for (k, v) in overrides {
        w.add(k, v.clone());
    }
    for t in src.tensors().iter().filter(|t| !drop.contains(&t.name.as_str())) {
        let mut dims = t.dims.clone();
        let mut data = src.tensor_data(t).to_vec();
        if let Some((_, rows)) = cut.iter().find(|(n, _)| *n == t.name) {
            data.truncate(data.len() / dims[1] * rows);
            dims[1] = *rows;
        }
        w.add_tensor(&t.name, t.ggml_type, &dims, data).unwrap();
    }
    let path = temp(name);
    w.write(&path).unwrap();
    path
}

fn open_err(path: &Path) -> String {
    let err = ModelFile::open(path).err().expect("the file was accepted");
    let msg = err.to_string();
    let file = path.file_name().unwrap().to_str().unwrap();
    assert!(msg.contains(file), "the file is not named: {msg}");
    msg
}

#[test]
fn an_unchanged_copy_opens() {
    let path = rewrite("same.gguf", &[], &[], &[]);
    let file = ModelFile::open(&path).unwrap();
    file.tokenizer().unwrap();
}

#[test]
fn more_layers_than_tensors_is_refused_without_allocating() {
    for layers in [3u32, 1_000_000, u32::MAX] {
        let path =
            rewrite("layers.gguf", &[("llama.block_count", GgufValue::U32(layers))], &[], &[]);
        let msg = open_err(&path);
        assert!(msg.contains(&format!("{layers} layers")) && msg.contains("blk.2"), "{msg}");
    }
}

#[test]
fn sizes_that_disagree_with_the_tensors_are_refused() {
    let cases = [
        ("llama.embedding_length", 1u64 << 24, "hidden_size 16777216"),
        ("llama.feed_forward_length", 1 << 30, "intermediate_size 1073741824"),
        ("llama.vocab_size", 1 << 31, "vocab_size 2147483648"),
    ];
    for (key, value, says) in cases {
        // key_length keeps head_dim at 16 when embedding_length changes
        let head_dim = ("llama.attention.key_length", GgufValue::U32(16));
        let path = rewrite("sizes.gguf", &[(key, GgufValue::U64(value)), head_dim], &[], &[]);
        let msg = open_err(&path);
        assert!(msg.contains(says) && msg.contains("the tensors say"), "{key}: {msg}");
    }
    let path = rewrite("wrap.gguf", &[("llama.vocab_size", GgufValue::U64(1 << 62))], &[], &[]);
    assert!(open_err(&path).contains("overflow"));
}

#[test]
fn a_missing_layer_tensor_is_named() {
    let path = rewrite("missing.gguf", &[], &["blk.1.ffn_down.weight"], &[]);
    let msg = open_err(&path);
    assert!(msg.contains("'blk.1.ffn_down.weight' is not in the model"), "{msg}");
}

#[test]
fn a_tokenizer_larger_than_the_embedding_is_refused() {
    // 128 embedding rows (and vocab_size 128) under the 256-token vocabulary
    let path = rewrite(
        "tok.gguf",
        &[("llama.vocab_size", GgufValue::U32(128))],
        &[],
        &[("token_embd.weight", 128), ("output.weight", 128)],
    );
    let file = ModelFile::open(&path).unwrap();
    let err = file.tokenizer().err().expect("a 256-token tokenizer over 128 rows was accepted");
    assert!(matches!(err.kind(), LoadError::TokenizerTooLarge { max_id: 255, vocab_size: 128 }));
    assert!(err.to_string().contains("tok.gguf"), "{err}");
}

#[cfg(unix)]
#[test]
fn odd_paths_are_reported_as_what_they_are() {
    let fifo = temp("fifo.gguf");
    let _ = std::fs::remove_file(&fifo);
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let msg = open_err(&fifo);
    assert!(msg.contains("FIFO") && !msg.to_lowercase().contains("no such file"), "{msg}");

    let link = temp("dangling.gguf");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(temp("nowhere.gguf"), &link).unwrap();
    assert!(open_err(&link).contains("symbolic link whose target does not exist"));

    let plain = temp("plainfile");
    std::fs::write(&plain, "x").unwrap();
    let msg = open_err(&plain.join("model.gguf"));
    assert!(msg.contains("Not a directory"), "{msg}");

    let missing = temp("absent.gguf");
    let msg = open_err(&missing).to_lowercase();
    assert_eq!(msg.matches("no such file").count(), 1, "the reason is printed once: {msg}");
}

/// A Qwen3-MoE GGUF whose expert counts or tensors are broken is refused with the key or the
/// tensor named, before anything is sized from them.
#[test]
fn moe_files_with_bad_experts_are_refused() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets/tiny-qwen3moe/tiny-qwen3moe-f32.gguf");
    let src = GgufFile::open(&path).unwrap();
    let key = |k: &str| format!("qwen3moe.{k}");
    let cases: [(&str, u32, &[&str]); 6] = [
        ("expert_used_count", 0, &["0 experts used per token of 16"]),
        ("expert_used_count", 17, &["17 experts used per token of 16"]),
        ("expert_used_count", 40, &["40 experts used per token", "at most 32"]),
        ("expert_count", 1 << 20, &["1048576 experts"]),
        ("expert_count", 32, &["blk.0.ffn_gate_inp.weight", "expert_count 32"]),
        ("expert_feed_forward_length", 64, &["blk.0.ffn_gate_exps.weight", "64"]),
    ];
    for (k, v, parts) in cases {
        let out = rewrite_from(&src, "moe.gguf", &[(&key(k), GgufValue::U32(v))], &[], &[]);
        let msg = open_err(&out);
        assert!(parts.iter().all(|p| msg.contains(p)), "{k} = {v}: {msg}");
    }
    let out = rewrite_from(&src, "moe-drop.gguf", &[], &["blk.1.ffn_down_exps.weight"], &[]);
    let msg = open_err(&out);
    assert!(msg.contains("blk.1.ffn_down_exps.weight"), "{msg}");
    let out = rewrite_from(&src, "moe-same.gguf", &[], &[], &[]);
    ModelFile::open(&out).unwrap();
}

/// DeepSeek-V2's experts: groups that do not divide the experts or hold too few of them, a
/// shared-expert count the tensors do not have, and a missing shared expert are refused by name.
#[test]
fn deepseek_moe_files_with_bad_experts_are_refused() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets/tiny-deepseek-moe/tiny-deepseek-moe-f32.gguf");
    let src = GgufFile::open(&path).unwrap();
    let key = |k: &str| format!("deepseek2.{k}");
    let cases: [(&str, u32, &[&str]); 4] = [
        ("expert_group_count", 3, &["16 experts in 3 groups"]),
        ("expert_group_used_count", 5, &["4 groups, 5 of them chosen"]),
        ("expert_group_count", 16, &["16 groups, 2 of them chosen, for 4 experts"]),
        ("expert_shared_count", 3, &["blk.1.ffn_gate_shexp.weight", "channels 96"]),
    ];
    for (k, v, parts) in cases {
        let out = rewrite_from(&src, "ds.gguf", &[(&key(k), GgufValue::U32(v))], &[], &[]);
        let msg = open_err(&out);
        assert!(parts.iter().all(|p| msg.contains(p)), "{k} = {v}: {msg}");
    }
    let out = rewrite_from(&src, "ds-drop.gguf", &[], &["blk.2.ffn_up_shexp.weight"], &[]);
    assert!(open_err(&out).contains("blk.2.ffn_up_shexp.weight"));
}

/// DeepSeek-V3's routing: a missing choice bias, groups of one expert (V3 ranks a
/// group by its two best) and a gating function kvrun does not run are refused by name.
#[test]
fn deepseek_v3_files_with_bad_routing_are_refused() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets/tiny-deepseek-v3/tiny-deepseek-v3-f32.gguf");
    let src = GgufFile::open(&path).unwrap();
    let key = |k: &str| format!("deepseek2.{k}");
    type Case<'a> = (&'a [(&'a str, u32)], &'a [&'a str]);
    let cases: [Case; 2] = [
        (
            &[("expert_group_count", 16), ("expert_group_used_count", 4)],
            &["16 experts in 16 groups", "at least two"],
        ),
        (&[("expert_gating_func", 3)], &["routing kvrun does not run", "noaux_tc"]),
    ];
    for (overrides, parts) in cases {
        let overrides: Vec<(String, GgufValue)> =
            overrides.iter().map(|(k, v)| (key(k), GgufValue::U32(*v))).collect();
        let overrides: Vec<(&str, GgufValue)> =
            overrides.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let out = rewrite_from(&src, "v3.gguf", &overrides, &[], &[]);
        let msg = open_err(&out);
        assert!(parts.iter().all(|p| msg.contains(p)), "{overrides:?}: {msg}");
    }
    let out = rewrite_from(&src, "v3-drop.gguf", &[], &["blk.2.exp_probs_b.bias"], &[]);
    let msg = open_err(&out);
    assert!(msg.contains("blk.2.exp_probs_b.bias"), "{msg}");
    let out = rewrite_from(&src, "v3-same.gguf", &[], &[], &[]);
    ModelFile::open(&out).unwrap();
}

/// gpt-oss: a missing attention sink, expert bias or router bias, or o_proj's bias, is refused by
/// the tensor's name; so is a file without its sliding window, and one with more query heads
/// than the attention kernels hold sinks for.
#[test]
fn gpt_oss_files_with_missing_tensors_are_refused() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("assets/tiny-gpt-oss/tiny-gpt-oss-mxfp4.gguf");
    let src = GgufFile::open(&path).unwrap();
    for t in [
        "blk.1.attn_sinks.weight",
        "blk.2.ffn_up_exps.bias",
        "blk.0.ffn_gate_inp.bias",
        "blk.3.attn_output.bias",
    ] {
        let out = rewrite_from(&src, "oss-drop.gguf", &[], &[t], &[]);
        let msg = open_err(&out);
        assert!(msg.contains(t), "{t}: {msg}");
    }
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        if k != "gpt-oss.attention.sliding_window" {
            w.add(k, v.clone());
        }
    }
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.dims, src.tensor_data(t).to_vec()).unwrap();
    }
    let out = temp("oss-window.gguf");
    w.write(&out).unwrap();
    assert!(open_err(&out).contains("gpt-oss.attention.sliding_window"));
    // more query heads than the kernels hold sinks for
    let heads = [("gpt-oss.attention.head_count", GgufValue::U32(136))];
    let msg = open_err(&rewrite_from(&src, "oss-heads.gguf", &heads, &[], &[]));
    assert!(msg.contains("136 query heads with attention sinks"), "{msg}");
    let out = rewrite_from(&src, "oss-same.gguf", &[], &[], &[]);
    ModelFile::open(&out).unwrap();
}
