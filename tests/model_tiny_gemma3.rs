//! The whole Gemma 3 forward on the GPU against an independent CPU forward pass: the float64
//! numpy implementation of HF Gemma 3 in `assets/tiny-gemma3/make_tiny_gemma3.py`, whose logits
//! are in `golden.json`. The tiny model has 5 sliding-window layers (window 48, RoPE base 10k)
//! and one global layer (base 1e6), Q/K norms, post-norms, GeGLU, a scaled and tied embedding;
//! the F32 GGUF and the mixed-quant one (Q8_0, Q4_0, Q4_1, F16), through one prefill, chunked
//! prefill, and prefill + decode steps, with shuffled block tables, both kernel families.
//!
//! The golden sequence (40 tokens) fits the window, so the window does not change it;
//! `golden-long.json` (120 tokens, 2.5 windows) runs the sliding layers in their own KV-cache
//! groups (5 sliding + 1 full) with their windows, against the same float64 forward.

mod common;

use common::*;
use kvrun::kernels::{KernelConfig, KernelFamily, Kernels};
use kvrun::loader::{Activation, Architecture, AttentionKind, ModelFile};
use kvrun::model::{ForwardBatch, LogitsWanted, Model, ModelOptions, SeqChunk};
use rand::seq::SliceRandom;
use serde_json::Value;
use std::path::PathBuf;

const DIR: &str = "assets/tiny-gemma3";
const MAX_MODEL_LEN: usize = 48; // the sliding window: full attention is exact up to here

fn golden() -> (Vec<u32>, usize, Value) {
    read_golden(&format!("{DIR}/golden.json"))
}

fn file(name: &str) -> ModelFile {
    ModelFile::open(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(DIR).join(name)).unwrap()
}

fn load(name: &str, block_size: usize, family: KernelFamily) -> Option<Model> {
    let t = gpu()?;
    let kernels = Kernels::with_config(KernelConfig::choose_family(&t.gpu.caps, family));
    let blocks = MAX_MODEL_LEN.div_ceil(block_size);
    let options = ModelOptions {
        max_num_batched_tokens: 64,
        max_num_seqs: 4,
        max_logit_rows: 64,
        max_model_len: MAX_MODEL_LEN,
        block_size,
        num_blocks: 2 * blocks + 3,
        kv_cache: Default::default(),
        kv_groups: kvrun::engine::kv_groups(file(name).config(), MAX_MODEL_LEN),
        state_snapshots: 0,
    };
    Some(Model::load(t.gpu.clone(), &kernels, &file(name), options).unwrap())
}

/// Runs the golden tokens through the model in `chunks` (lengths) on a shuffled block table.
fn run_chunks(
    model: &mut Model,
    tokens: &[u32],
    chunks: &[usize],
    bs: usize,
    seed: u64,
) -> Vec<f32> {
    let n = MAX_MODEL_LEN.div_ceil(bs);
    let mut table: Vec<u32> = (0..(2 * n + 3) as u32).collect();
    table.shuffle(&mut rng(seed));
    table.truncate(n);
    let mut out = Vec::new();
    let mut pos = 0;
    for &len in chunks {
        let chunk = SeqChunk {
            tokens: &tokens[pos..pos + len],
            start_pos: pos,
            block_tables: std::slice::from_ref(&table),
            slot_mapping: None,
            logits: LogitsWanted::Range(0..len),
            stage_slot: 0,
            states: Default::default(),
        };
        out.extend(
            model.forward(&ForwardBatch::new(&[chunk], bs, model.query_tile())).unwrap().data,
        );
        pos += len;
    }
    assert_eq!(pos, tokens.len());
    out
}

/// 120 tokens past the 48-token window: the sliding layers attend through their window, each
/// group through its own shuffled table (disjoint blocks), in one prefill, chunks that start
/// mid-window, and decode steps, both kernel families, bit-identical to each other.
#[test]
fn past_the_window_the_sliding_layers_match_the_cpu_forward() {
    let (tokens, vocab, g) = read_golden(&format!("{DIR}/golden-long.json"));
    let want = golden_logits(&g, "f32");
    let (max_len, bs) = (128, 16);
    let f = file("tiny-gemma3-f32.gguf");
    let default = kvrun::engine::kv_groups(f.config(), max_len);
    assert_eq!(default.len(), 6, "5 sliding layers and 1 global, one slot each");
    let kinds: Vec<_> = (0..6).map(|l| default.kind(default.layer_slot(l).0)).collect();
    for groups in [
        default.clone(),
        kvrun::kv::KvGroups::with_slots(&kinds, 3),
        kvrun::kv::KvGroups::with_slots(&kinds, 5),
    ] {
        eprintln!("groups: {} of {} slots", groups.len(), groups.slots_per_block());
        for family in [KernelFamily::Auto, KernelFamily::Gpu] {
            let Some((mut model, tables)) = load_grouped(&f, family, &groups, (max_len, bs), 7)
            else {
                return;
            };
            let mut runs = Vec::new();
            let mut steps = vec![60];
            steps.extend(std::iter::repeat_n(1, 60));
            for chunks in [vec![120], vec![37, 50, 33], steps] {
                let out = run_grouped(&mut model, &tokens, &chunks, &tables, bs);
                check_logits(&format!("{family:?} past the window"), &out, &want, vocab);
                runs.push(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
            assert!(runs.iter().all(|r| *r == runs[0]), "{family:?}: chunking changed the bits");
        }
    }
}

#[test]
fn config_has_mixed_sliding_and_global_layers() {
    let f = file("tiny-gemma3-f32.gguf");
    let c = f.config();
    assert_eq!(c.arch, Architecture::Gemma3);
    assert!(c.qk_norm && c.post_norms && c.tie_word_embeddings);
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!(c.embedding_scale, Some(8.0)); // sqrt(64)
    assert_eq!((c.num_heads, c.num_kv_heads, c.head_dim), (4, 2, 32));
    for (i, l) in c.layers.iter().enumerate() {
        let (kind, theta) = if i == 5 {
            (AttentionKind::Full, 1e6)
        } else {
            (AttentionKind::Sliding { window: 48 }, 1e4)
        };
        assert_eq!((l.attention, l.rope.theta), (kind, theta), "layer {i}");
    }
}

#[test]
fn gpu_logits_match_independent_cpu_forward() {
    let (tokens, vocab, g) = golden();
    for family in [KernelFamily::Auto, KernelFamily::Gpu] {
        for (name, variant) in [("tiny-gemma3-f32.gguf", "f32"), ("tiny-gemma3-q.gguf", "gguf_q")] {
            let want = golden_logits(&g, variant);
            let Some(mut model) = load(name, 16, family) else { return };
            let got = run_chunks(&mut model, &tokens, &[tokens.len()], 16, 1);
            check_logits(&format!("{name} {family:?} one prefill"), &got, &want, vocab);
        }
    }
}

#[test]
fn chunked_prefill_and_decode_steps_match() {
    let (tokens, vocab, g) = golden();
    let want = golden_logits(&g, "f32");
    for (bs, chunks) in [(1usize, vec![17, 23]), (16, vec![30, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])] {
        let Some(mut model) = load("tiny-gemma3-f32.gguf", bs, KernelFamily::Auto) else { return };
        let got = run_chunks(&mut model, &tokens, &chunks, bs, bs as u64);
        check_logits(&format!("block size {bs}, chunks {chunks:?}"), &got, &want, vocab);
    }
}

/// Past the window the sliding layers need their own KV-cache groups: options whose groups do
/// not match the layers at this context are refused, naming the layer.
#[test]
fn groups_that_do_not_match_the_layers_are_refused() {
    let Some(t) = gpu() else { return };
    let kernels = Kernels::new(&t.gpu);
    let f = file("tiny-gemma3-f32.gguf");
    let options = ModelOptions {
        max_num_batched_tokens: 64,
        max_num_seqs: 1,
        max_logit_rows: 1,
        max_model_len: MAX_MODEL_LEN + 1,
        block_size: 16,
        num_blocks: 32,
        kv_cache: Default::default(),
        kv_groups: kvrun::kv::KvGroups::uniform(f.config().num_layers),
        state_snapshots: 0,
    };
    let err = Model::load(t.gpu.clone(), &kernels, &f, options.clone())
        .err()
        .expect("full-attention groups for sliding layers are refused");
    assert!(err.to_string().contains("layer 0 attends as Sliding"), "{err}");
    let groups = kvrun::engine::kv_groups(f.config(), MAX_MODEL_LEN + 1);
    assert!(groups.len() > 1, "past the window the sliding layers get their own groups");
    Model::load(t.gpu.clone(), &kernels, &f, ModelOptions { kv_groups: groups, ..options })
        .unwrap();
}

/// Gemma 3 as an HF directory (`assets/tiny-gemma3-hf`: transformers' `Gemma3ForCausalLM`, norm
/// weights stored as HF's w of `x · (1 + w)`, window 11, so the 40 golden tokens run the five
/// sliding layers through their windows in their own KV-cache groups) against transformers'
/// own forward in float64 (`make_tiny_gemma3_hf.py`), and the f32 and Q8_0 GGUFs llama.cpp's
/// `convert_hf_to_gguf.py` wrote from that directory (Q8_0 against the forward of its
/// dequantized weights): one prefill, chunks that start mid-window, decode steps, both kernel
/// families; each file's three runs bit-identical.
#[test]
fn hf_gemma3_matches_transformers_as_directory_and_converted_gguf() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-gemma3-hf");
    let (tokens, vocab, g) = read_golden("assets/tiny-gemma3-hf/golden.json");
    let (max_len, bs) = (64, 8);
    let files = [
        ("hf", "hf_f32"),
        ("tiny-gemma3-hf-f32.gguf", "hf_f32"),
        ("tiny-gemma3-hf-q8_0.gguf", "gguf_q8_0"),
    ];
    for (rel, variant) in files {
        let f = ModelFile::open(&dir.join(rel)).unwrap();
        let c = f.config();
        assert_eq!((c.arch, c.num_layers, c.head_dim), (Architecture::Gemma3, 6, 32), "{rel}");
        let sliding = AttentionKind::Sliding { window: 11 };
        assert!(c.layers[..5].iter().all(|l| l.attention == sliding), "{rel}");
        let groups = kvrun::engine::kv_groups(c, max_len);
        assert!(groups.len() > 1, "{rel}: the sliding layers get their own groups");
        let want = golden_logits(&g, variant);
        for family in [KernelFamily::Auto, KernelFamily::Gpu] {
            let Some((mut model, tables)) = load_grouped(&f, family, &groups, (max_len, bs), 11)
            else {
                return;
            };
            let mut runs = Vec::new();
            let mut steps = vec![27];
            steps.extend(std::iter::repeat_n(1, 13));
            for chunks in [vec![40], vec![13, 1, 26], steps] {
                let out = run_grouped(&mut model, &tokens, &chunks, &tables, bs);
                check_logits(&format!("HF Gemma 3 {rel} {family:?}"), &out, &want, vocab);
                runs.push(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
            assert!(runs.iter().all(|r| *r == runs[0]), "{rel} {family:?}: chunking changed bits");
        }
    }
}

/// The HF Gemma 3's perplexity (`make_tiny_gemma3_hf.py`: 4 chunks of 128 tokens, so the
/// sliding layers slide): the f32 files within 0.01 % of transformers' float64 forward and of
/// llama.cpp's llama-perplexity on the converted GGUF (measured: 353.1671 against 353.1766
/// and 353.1668); the Q8_0 GGUF within 0.01 % of transformers on its dequantized weights and
/// 0.5 % of llama.cpp (354.0763: llama.cpp rounds a Q8_0 product's activations to 8 bits).
#[test]
fn hf_gemma3_perplexity_matches_transformers_and_llama_cpp() {
    let files = [
        ("hf", "hf_f32"),
        ("tiny-gemma3-hf-f32.gguf", "hf_f32"),
        ("tiny-gemma3-hf-q8_0.gguf", "gguf_q8_0"),
    ];
    check_tiny_perplexity("assets/tiny-gemma3-hf", &files, 1e-4, 5e-3);
}

/// The HF Gemma 3's f32 GGUF with `gemma3.rope.dimension_count = 16` added: partial RoPE, the
/// first 16 of each head's 32 channels rotated (NEOX pairs within them), written to a
/// temporary folder `out`.
fn partial_rope_gguf(dir: &std::path::Path, out: &std::path::Path) -> PathBuf {
    use kvrun::loader::{GgufFile, GgufWriter};
    let name = "tiny-gemma3-hf-f32.gguf";
    let src = GgufFile::open(&dir.join(name)).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in src.metadata() {
        w.add(k, v.clone());
    }
    w.add_u32("gemma3.rope.dimension_count", 16);
    for t in src.tensors() {
        w.add_tensor(&t.name, t.ggml_type, &t.dims, src.tensor_data(t).to_vec()).unwrap();
    }
    w.write(&out.join(name)).unwrap();
    out.join(name)
}

/// Partial RoPE end to end (`golden-partial-rope.json`, `make_tiny_gemma3_hf.py`): the HF Gemma
/// 3's GGUF rotating 16 of 32 channels against transformers' float64 forward of the same
/// weights with its partial-rotary RoPE — logits through one prefill, chunks and decode steps,
/// bit-identical, both kernel families — and its perplexity within 0.01 % of that forward's
/// and of llama.cpp's llama-perplexity on the same file (measured: kvrun 378.3454 against
/// 378.3435 and 378.3466; rotating whole heads gives 353.17).
#[test]
fn partial_rope_gguf_matches_transformers_and_llama_cpp() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-gemma3-hf");
    let (tokens, vocab, g) = read_golden("assets/tiny-gemma3-hf/golden-partial-rope.json");
    let out = tempfile::tempdir().unwrap(); // removed when the test ends
    let path = partial_rope_gguf(&dir, out.path());
    let f = ModelFile::open(&path).unwrap();
    assert_eq!((f.config().rotary_dims, f.config().head_dim), (Some(16), 32));
    let (max_len, bs) = (64, 8);
    let groups = kvrun::engine::kv_groups(f.config(), max_len);
    let want = golden_logits(&g, "hf_f32");
    for family in [KernelFamily::Auto, KernelFamily::Gpu] {
        let Some((mut model, tables)) = load_grouped(&f, family, &groups, (max_len, bs), 12) else {
            return;
        };
        let mut runs = Vec::new();
        let mut steps = vec![27];
        steps.extend(std::iter::repeat_n(1, 13));
        for chunks in [vec![40], vec![13, 1, 26], steps] {
            let out = run_grouped(&mut model, &tokens, &chunks, &tables, bs);
            check_logits(&format!("partial RoPE {family:?} {chunks:?}"), &out, &want, vocab);
            runs.push(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
        }
        assert!(runs.iter().all(|r| *r == runs[0]), "{family:?}: chunking changed bits");
    }
    check_perplexity(&g, &path, "hf_f32", 1e-4, 1e-4);
}
