//! The whole model on the GPU against an independent CPU forward pass: the float64 numpy
//! implementation of HF Llama in `assets/tiny-llama/make_tiny_llama.py`, whose logits are in
//! `golden.json`. Covers the HF safetensors directory (NEOX RoPE), the f32 GGUF (llama.cpp's
//! permuted Q/K, interleaved RoPE) and the mixed-quant GGUF (Q8_0, Q4_0, Q4_1, F16), through
//! one prefill, chunked prefill, and prefill + decode steps, with shuffled block tables.

mod common;

use common::*;
use kvrun::kernels::{KernelConfig, KernelFamily, Kernels};
use kvrun::loader::{GgufFile, GgufWriter, ModelFile};
use kvrun::model::{ForwardBatch, LogitsWanted, Model, ModelOptions, SeqChunk};
use kvrun::quant::{dequantize_row, GgmlType};
use rand::seq::SliceRandom;
use std::path::PathBuf;

struct Golden {
    tokens: Vec<u32>,
    vocab: usize,
    /// variant → [40, vocab]
    logits: std::collections::HashMap<String, Vec<f32>>,
}

fn golden() -> Golden {
    golden_of("assets/tiny-llama/golden.json")
}

fn golden_of(rel: &str) -> Golden {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let tokens =
        v["token_ids"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect();
    let vocab = v["logits_shape"][1].as_u64().unwrap() as usize;
    let logits = v["logits"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, rows)| {
            let flat: Vec<f32> = rows
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| {
                    r.as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap() as f32)
                        .collect::<Vec<_>>()
                })
                .collect();
            (k.clone(), flat)
        })
        .collect();
    Golden { tokens, vocab, logits }
}

/// Both kernel families: what this adapter selects, and the discrete-GPU variants forced.
const FAMILIES: [KernelFamily; 2] = [KernelFamily::Auto, KernelFamily::Gpu];

fn load(rel: &str, block_size: usize, family: KernelFamily) -> Option<(Model, ModelFile)> {
    load_from(&PathBuf::from("assets/tiny-llama").join(rel), block_size, family)
}

fn load_from(
    rel: &std::path::Path,
    block_size: usize,
    family: KernelFamily,
) -> Option<(Model, ModelFile)> {
    let t = gpu()?;
    let kernels = Kernels::with_config(KernelConfig::choose_family(&t.gpu.caps, family));
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel);
    let file = ModelFile::open(&path).unwrap();
    let options = ModelOptions {
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        max_logit_rows: 64,
        max_model_len: 128,
        block_size,
        num_blocks: 2 * 128usize.div_ceil(block_size) + 3,
        kv_cache: Default::default(),
        kv_groups: kvrun::engine::kv_groups(file.config(), 128),
        state_snapshots: 0,
    };
    let model = Model::load(t.gpu.clone(), &kernels, &file, options).unwrap();
    Some((model, file))
}

/// A shuffled block table covering 128 tokens.
fn table(block_size: usize, seed: u64) -> Vec<u32> {
    let n = 128usize.div_ceil(block_size);
    let mut ids: Vec<u32> = (0..(2 * n + 3) as u32).collect();
    ids.shuffle(&mut rng(seed));
    ids.truncate(n);
    ids
}

/// Runs the golden tokens through the model in `chunks` (lengths), returning [40, vocab] logits.
fn run_chunks(
    model: &mut Model,
    tokens: &[u32],
    chunks: &[usize],
    block_size: usize,
    seed: u64,
) -> Vec<f32> {
    let table = table(block_size, seed);
    let mut out = Vec::new();
    let mut pos = 0;
    for &n in chunks {
        let chunk = SeqChunk {
            tokens: &tokens[pos..pos + n],
            start_pos: pos,
            block_tables: std::slice::from_ref(&table),
            slot_mapping: None,
            logits: LogitsWanted::Range(0..n),
            stage_slot: 0,
            states: Default::default(),
        };
        let batch = ForwardBatch::new(&[chunk], block_size, model.query_tile());
        out.extend(model.forward(&batch).unwrap().data);
        pos += n;
    }
    assert_eq!(pos, tokens.len());
    out
}

#[test]
fn gpu_logits_match_independent_cpu_forward_for_all_three_files() {
    let g = golden();
    for family in FAMILIES {
        for (rel, variant) in
            [("hf", "hf_f32"), ("tiny-llama-f32.gguf", "hf_f32"), ("tiny-llama-q.gguf", "gguf_q")]
        {
            let Some((mut model, _)) = load(rel, 16, family) else { return };
            let got = run_chunks(&mut model, &g.tokens, &[40], 16, 1);
            check_logits(
                &format!("{family:?} kernels, {rel} one prefill"),
                &got,
                &g.logits[variant],
                g.vocab,
            );
        }
    }
}

/// Gate and up of different formats take the stacked path (two matmul parts into `gate_up`
/// and a SiLU·mul dispatch) instead of the GLU epilogue: the quantized tiny GGUF with layer 1's
/// Q4_0 `ffn_up` rewritten as F32 of the same values must give the same logits as the float64
/// forward of that file.
#[test]
fn mixed_format_gate_up_matches_independent_cpu_forward() {
    let g = golden();
    let src_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-llama/tiny-llama-q.gguf");
    let src = GgufFile::open(&src_path).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.add(k, v.clone());
    }
    let up = "blk.1.ffn_up.weight";
    for t in src.tensors() {
        let data = src.tensor_data(t);
        if t.name == up {
            assert_eq!(t.ggml_type, GgmlType::Q4_0, "the fixture's {up} changed type");
            let mut values = vec![0f32; t.dims.iter().product()];
            for (row, out) in data.chunks(data.len() / t.dims[1]).zip(values.chunks_mut(t.dims[0]))
            {
                dequantize_row(t.ggml_type, row, out).unwrap();
            }
            w.add_f32_tensor(&t.name, &t.dims, &values).unwrap();
        } else {
            w.add_tensor(&t.name, t.ggml_type, &t.dims, data.to_vec()).unwrap();
        }
    }
    let dir = tempfile::tempdir().unwrap(); // removed when the test ends
    let path = dir.path().join("tiny-llama-mixed-gate-up.gguf");
    w.write(&path).unwrap();
    for family in FAMILIES {
        let Some((mut model, _)) = load_from(&path, 16, family) else { return };
        let got = run_chunks(&mut model, &g.tokens, &[32, 8], 16, 2);
        let what = format!("{family:?} kernels, F32 up beside Q4_0 gate");
        check_logits(&what, &got, &g.logits["gguf_q"], g.vocab);
    }
}

/// Mistral-style sliding window on every layer (assets/tiny-llama/hf-window: the tiny Llama's
/// weights with `sliding_window` 11) against the float64 forward with HF's window mask: one
/// prefill, chunks that start mid-window, and decode steps, across block sizes and both kernel
/// families, bit-identical to each other (the engine tests run it with blocks dropped).
#[test]
fn sliding_window_model_matches_independent_cpu_forward() {
    let g = golden();
    let want = &g.logits["hf_window"];
    let cases = FAMILIES.into_iter().flat_map(|f| [1usize, 4, 16].map(|bs| (f, bs)));
    for (i, (family, bs)) in cases.enumerate() {
        let Some((mut model, file)) = load("hf-window", bs, family) else { return };
        let groups = &model.options().kv_groups;
        assert_eq!(groups.kind(0), kvrun::kv::GroupKind::Sliding { window: 11 });
        assert!(file
            .config()
            .layers
            .iter()
            .all(|l| l.attention == kvrun::loader::AttentionKind::Sliding { window: 11 }));
        let one = run_chunks(&mut model, &g.tokens, &[40], bs, 40 + i as u64);
        check_logits(&format!("{family:?} block {bs} window prefill"), &one, want, g.vocab);
        let chunked = run_chunks(&mut model, &g.tokens, &[7, 13, 20], bs, 50 + i as u64);
        check_logits(&format!("{family:?} block {bs} window chunks"), &chunked, want, g.vocab);
        let mut steps = vec![12];
        steps.extend(std::iter::repeat_n(1, 28));
        let decoded = run_chunks(&mut model, &g.tokens, &steps, bs, 60 + i as u64);
        check_logits(&format!("{family:?} block {bs} window decodes"), &decoded, want, g.vocab);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(&one) == bits(&chunked) && bits(&one) == bits(&decoded), "{family:?} {bs}");
        // The window matters: the full-attention logits differ from position 11 on.
        let full = &g.logits["hf_f32"];
        assert!((11 * g.vocab..40 * g.vocab).any(|j| (full[j] - want[j]).abs() > 0.05));
    }
}

/// HF `rope_scaling` (assets/tiny-llama/hf-rope-llama3 and hf-rope-linear: the tiny Llama's
/// weights with Llama 3's frequency-dependent scaling — one frequency kept, one smoothed, six
/// divided — and with linear position interpolation) against the float64 forward computing the
/// frequencies as HF's `modeling_rope_utils` does: a prefill and decode steps, both kernel
/// families. The scaling matters: the unscaled logits differ by up to 4.5.
#[test]
fn rope_scaling_models_match_independent_cpu_forward() {
    let g = golden();
    for (dir, key) in [("hf-rope-llama3", "hf_rope_llama3"), ("hf-rope-linear", "hf_rope_linear")] {
        let want = &g.logits[key];
        for (i, family) in FAMILIES.into_iter().enumerate() {
            let Some((mut model, _)) = load(dir, 16, family) else { return };
            let one = run_chunks(&mut model, &g.tokens, &[40], 16, 70 + i as u64);
            check_logits(&format!("{dir} {family:?} prefill"), &one, want, g.vocab);
            let mut steps = vec![9];
            steps.extend(std::iter::repeat_n(1, 31));
            let decoded = run_chunks(&mut model, &g.tokens, &steps, 16, 80 + i as u64);
            check_logits(&format!("{dir} {family:?} decodes"), &decoded, want, g.vocab);
        }
        let full = &g.logits["hf_f32"];
        assert!((0..40 * g.vocab).any(|j| (full[j] - want[j]).abs() > 0.5), "{dir}: no effect");
    }
}

/// Qwen2's q/k/v biases (assets/tiny-qwen2, HF safetensors) against its own float64 forward
/// (`make_tiny_qwen2.py`; dropping the biases moves those logits by up to 4.7).
#[test]
fn qwen2_bias_path_matches_independent_cpu_forward() {
    let g = golden_of("assets/tiny-qwen2/golden.json");
    for family in FAMILIES {
        let rel = std::path::Path::new("assets/tiny-qwen2/hf");
        let Some((mut model, _)) = load_from(rel, 16, family) else { return };
        let got = run_chunks(&mut model, &g.tokens, &[40], 16, 2);
        check_logits(
            &format!("{family:?} kernels, tiny Qwen2"),
            &got,
            &g.logits["hf_f32"],
            g.vocab,
        );
        let chunked = run_chunks(&mut model, &g.tokens, &[17, 1, 22], 16, 3);
        check_logits(
            &format!("{family:?} kernels, tiny Qwen2 chunked"),
            &chunked,
            &g.logits["hf_f32"],
            g.vocab,
        );
    }
}

/// Qwen3 (assets/tiny-qwen3: per-head Q/K norms, explicit head_dim 32 ≠ hidden / heads, tied
/// embeddings, no biases) against HF transformers' own forward in float64
/// (`make_tiny_qwen3.py`): the HF directory, and the f32 and Q8_0 GGUFs llama.cpp's
/// `convert_hf_to_gguf.py` wrote from it (Q8_0 against the forward of its dequantized
/// weights), through one prefill, chunked prefill and decode steps; the three bit-identical.
#[test]
fn qwen3_matches_transformers_as_hf_directory_and_converted_gguf() {
    let g = golden_of("assets/tiny-qwen3/golden.json");
    let files = [
        ("hf", "hf_f32"),
        ("tiny-qwen3-f32.gguf", "hf_f32"),
        ("tiny-qwen3-q8_0.gguf", "gguf_q8_0"),
    ];
    for (i, (family, (rel, variant))) in
        FAMILIES.into_iter().flat_map(|f| files.map(|file| (f, file))).enumerate()
    {
        let path = std::path::Path::new("assets/tiny-qwen3").join(rel);
        let Some((mut model, file)) = load_from(&path, 16, family) else { return };
        assert_eq!(file.config().arch, kvrun::loader::Architecture::Qwen3, "{rel}");
        let what = format!("{family:?} kernels, tiny Qwen3 {rel}");
        let want = &g.logits[variant];
        let seed = 40 + 3 * i as u64;
        let one = run_chunks(&mut model, &g.tokens, &[40], 16, seed);
        check_logits(&format!("{what} one prefill"), &one, want, g.vocab);
        let chunked = run_chunks(&mut model, &g.tokens, &[17, 1, 22], 16, seed + 1);
        check_logits(&format!("{what} chunked"), &chunked, want, g.vocab);
        let mut steps = vec![29];
        steps.extend(std::iter::repeat_n(1, 11));
        let decoded = run_chunks(&mut model, &g.tokens, &steps, 16, seed + 2);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(bits(&one) == bits(&chunked), "{what}: chunked prefill not bit-identical");
        assert!(bits(&one) == bits(&decoded), "{what}: decode steps not bit-identical");
    }
}

/// The tiny Qwen3's perplexity (`make_tiny_qwen3.py`: 4 chunks of 128 tokens of the
/// evaluation text): the f32 files within 0.01 % of transformers' float64 forward and of
/// llama.cpp's llama-perplexity on the converted GGUF (measured: 526.9743 against 526.9791 and
/// 526.9747); the Q8_0 GGUF within 0.01 % of transformers on its dequantized weights (528.4504
/// against 528.4599) and 0.5 % of llama.cpp (528.0175: llama.cpp rounds the activations of a
/// Q8_0 product to 8 bits, kvrun does not).
#[test]
fn qwen3_perplexity_matches_transformers_and_llama_cpp() {
    let files = [
        ("hf", "hf_f32"),
        ("tiny-qwen3-f32.gguf", "hf_f32"),
        ("tiny-qwen3-q8_0.gguf", "gguf_q8_0"),
    ];
    check_tiny_perplexity("assets/tiny-qwen3", &files, 1e-4, 5e-3);
}

/// A step that reads back only its rows' argmaxes (`LogitReadback::Argmax`, greedy sampling on
/// the GPU) gets, row for row, the token the CPU greedy sampler picks from the same step's
/// logit rows read back whole: 40 prefill rows and a decode step's one, both kernel families.
#[test]
fn gpu_argmax_readback_is_the_cpu_greedy_choice() {
    use kvrun::model::LogitReadback;
    use kvrun::sample::{Sampler, SamplingParams};
    let g = golden();
    let greedy = Sampler::new(&SamplingParams { temperature: 0.0, ..Default::default() });
    for family in FAMILIES {
        let Some((mut model, _)) = load("tiny-llama-q.gguf", 16, family) else { return };
        let table = table(16, 60);
        for (start, n) in [(0usize, 40usize), (39, 1)] {
            let chunk = SeqChunk {
                tokens: &g.tokens[start..start + n],
                start_pos: start,
                block_tables: std::slice::from_ref(&table),
                slot_mapping: None,
                logits: LogitsWanted::Range(0..n),
                stage_slot: 0,
                states: Default::default(),
            };
            let mut batch = ForwardBatch::new(&[chunk], 16, model.query_tile());
            let rows = model.forward(&batch).unwrap();
            assert!(rows.token_ids.is_none());
            batch.readback = LogitReadback::Argmax;
            let ids = model.forward(&batch).unwrap();
            assert!(ids.data.is_empty(), "{family:?}: argmax readback also read the rows");
            let ids = ids.token_ids.expect("argmax readback");
            let want: Vec<u32> = (0..n).map(|r| greedy.clone().sample(rows.row(r))).collect();
            assert_eq!(ids, want, "{family:?}, {n} rows from position {start}");
        }
    }
}

#[test]
fn chunked_prefill_and_decode_steps_match_across_block_sizes() {
    let g = golden();
    let cases = FAMILIES.into_iter().flat_map(|f| [1usize, 16, 64].map(|bs| (f, bs)));
    for (i, (family, bs)) in cases.enumerate() {
        let Some((mut model, _)) = load("tiny-llama-q.gguf", bs, family) else { return };
        let want = &g.logits["gguf_q"];
        let one = run_chunks(&mut model, &g.tokens, &[40], bs, 10 + i as u64);
        check_logits(&format!("{family:?} block {bs} prefill"), &one, want, g.vocab);
        let chunked = run_chunks(&mut model, &g.tokens, &[13, 13, 14], bs, 20 + i as u64);
        check_logits(&format!("{family:?} block {bs} chunked prefill"), &chunked, want, g.vocab);
        let mut steps = vec![25];
        steps.extend(std::iter::repeat_n(1, 15));
        let decoded = run_chunks(&mut model, &g.tokens, &steps, bs, 30 + i as u64);
        check_logits(
            &format!("{family:?} block {bs} prefill + 15 decode steps"),
            &decoded,
            want,
            g.vocab,
        );
        // Batch invariance: a token's logits do not depend on how its step was composed.
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(&one) == bits(&chunked),
            "{family:?} block {bs}: chunked prefill is not bit-identical to one prefill"
        );
        assert!(
            bits(&one) == bits(&decoded),
            "{family:?} block {bs}: decode steps are not bit-identical to prefill"
        );
    }
}

/// Two sequences in one step (a decode next to a prefill chunk) give each the logits it gets
/// alone.
#[test]
fn mixed_batch_equals_sequences_alone() {
    let g = golden();
    let Some((mut model, _)) = load("tiny-llama-q.gguf", 16, KernelFamily::Auto) else { return };
    let qt = model.query_tile();
    // B takes the pool's last 8 blocks (in reverse), A a shuffled table without them.
    let n_blocks = model.options().num_blocks as u32;
    let tb: Vec<u32> = (0..8).map(|i| n_blocks - 1 - i).collect();
    let mut ta: Vec<u32> = (0..n_blocks - 8).collect();
    ta.shuffle(&mut rng(40));
    // A: prefill 30 tokens; B: prefill 20 tokens.
    let a0 = SeqChunk {
        tokens: &g.tokens[..30],
        start_pos: 0,
        block_tables: std::slice::from_ref(&ta),
        slot_mapping: None,
        logits: LogitsWanted::None,
        stage_slot: 0,
        states: Default::default(),
    };
    let b0 = SeqChunk {
        tokens: &g.tokens[..20],
        start_pos: 0,
        block_tables: std::slice::from_ref(&tb),
        slot_mapping: None,
        logits: LogitsWanted::None,
        stage_slot: 1,
        states: Default::default(),
    };
    model.forward(&ForwardBatch::new(&[a0, b0], 16, qt)).unwrap();
    // one step: A decodes token 30, B prefills 20..40
    let a1 = SeqChunk {
        tokens: &g.tokens[30..31],
        start_pos: 30,
        block_tables: std::slice::from_ref(&ta),
        slot_mapping: None,
        logits: LogitsWanted::Last,
        stage_slot: 0,
        states: Default::default(),
    };
    let b1 = SeqChunk {
        tokens: &g.tokens[20..40],
        start_pos: 20,
        block_tables: std::slice::from_ref(&tb),
        slot_mapping: None,
        logits: LogitsWanted::Range(0..20),
        stage_slot: 1,
        states: Default::default(),
    };
    let mixed = model.forward(&ForwardBatch::new(&[a1, b1], 16, qt)).unwrap();
    assert_eq!(mixed.chunks[0], 0);
    let alone = run_chunks(&mut model, &g.tokens, &[40], 16, 42);
    let v = g.vocab;
    assert_eq!(mixed.row(0), &alone[30 * v..31 * v], "decode next to a prefill differs from alone");
    for r in 0..20 {
        assert_eq!(
            mixed.row(1 + r),
            &alone[(20 + r) * v..(21 + r) * v],
            "prefill row {r} next to a decode differs"
        );
    }
}

/// Multi-head latent attention (assets/tiny-deepseek: a DeepSeek-V2-shaped model with q-LoRA,
/// without it, and with DeepSeek's YaRN) against the float64 forward of HF's expanded
/// attention: one prefill, chunks, and decode steps, block sizes 1 and 16, both kernel
/// families, bit-identical to each other. The KV pool holds one latent row of
/// kv_lora_rank + qk_rope_head_dim = 128 f16 per token and layer, nothing per head.
#[test]
fn mla_models_match_independent_cpu_forward() {
    let g = golden_of("assets/tiny-deepseek/golden.json");
    let dirs = [("hf", "hf_qlora"), ("hf-no-qlora", "hf_no_qlora"), ("hf-yarn", "hf_yarn")];
    for (d, (dir, key)) in dirs.into_iter().enumerate() {
        let want = &g.logits[key];
        let cases = FAMILIES.into_iter().flat_map(|f| [1usize, 16].map(|bs| (f, bs)));
        for (i, (family, bs)) in cases.enumerate() {
            let rel = PathBuf::from("assets/tiny-deepseek").join(dir);
            let Some((mut model, _)) = load_from(&rel, bs, family) else { return };
            let blocks = model.options().num_blocks as u64;
            assert_eq!(model.kv_pool().bytes, blocks * bs as u64 * 2 * 128 * 2, "{dir}");
            let seed = (100 + d * 10 + i) as u64;
            let what = format!("{dir} {family:?} block {bs}");
            let one = run_chunks(&mut model, &g.tokens, &[40], bs, seed);
            check_logits(&format!("{what} prefill"), &one, want, g.vocab);
            let chunked = run_chunks(&mut model, &g.tokens, &[7, 13, 20], bs, seed + 1);
            check_logits(&format!("{what} chunks"), &chunked, want, g.vocab);
            let mut steps = vec![9];
            steps.extend(std::iter::repeat_n(1, 31));
            let decoded = run_chunks(&mut model, &g.tokens, &steps, bs, seed + 2);
            check_logits(&format!("{what} decodes"), &decoded, want, g.vocab);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert!(bits(&one) == bits(&chunked) && bits(&one) == bits(&decoded), "{what}");
        }
    }
    // the variants differ: q-LoRA vs q_proj, and YaRN's frequencies and softmax scale
    let diff = |a: &str, b: &str| {
        g.logits[a].iter().zip(&g.logits[b]).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    };
    assert!(diff("hf_qlora", "hf_yarn") > 1.0 && diff("hf_qlora", "hf_no_qlora") > 1.0);
}

/// The tiny DeepSeek as GGUF `deepseek2` (written with gguf-py's names and keys): f32 in the
/// current converter's layout (`attn_k_b` / `attn_v_b`, head_count_kv 1, key_length = latent
/// width) against the q-LoRA golden, and Q8_0/F16 in the older layout (`attn_kv_b`, per-head
/// key_length, no q-LoRA) against the float64 forward on gguf-py's dequantized weights.
#[test]
fn mla_gguf_files_match_independent_cpu_forward() {
    let g = golden_of("assets/tiny-deepseek/golden.json");
    for (file, key) in [("tiny-deepseek-f32.gguf", "hf_qlora"), ("tiny-deepseek-q.gguf", "gguf_q")]
    {
        for (i, family) in FAMILIES.into_iter().enumerate() {
            let rel = PathBuf::from("assets/tiny-deepseek").join(file);
            let Some((mut model, f)) = load_from(&rel, 16, family) else { return };
            let c = f.config();
            assert_eq!((c.num_kv_heads, c.head_dim, c.rope_dim()), (1, 128, 32), "{file}");
            let what = format!("{file} {family:?}");
            let one = run_chunks(&mut model, &g.tokens, &[40], 16, 200 + i as u64);
            check_logits(&format!("{what} prefill"), &one, &g.logits[key], g.vocab);
            let mut steps = vec![5];
            steps.extend(std::iter::repeat_n(1, 35));
            let decoded = run_chunks(&mut model, &g.tokens, &steps, 16, 210 + i as u64);
            check_logits(&format!("{what} decodes"), &decoded, &g.logits[key], g.vocab);
        }
    }
}

/// A DeepSeek config with mixture-of-experts layers (routed as DeepSeek-V3 routes them) over
/// weights that have none is refused at open, naming the first missing tensor.
#[test]
fn mla_config_with_moe_layers_over_dense_weights_is_refused() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-deepseek/hf-moe");
    let err = ModelFile::open(&path).err().expect("MoE must be refused").to_string();
    assert!(err.contains("tensor 'blk.1.ffn_gate_inp.weight' is not in the model"), "{err}");
}
