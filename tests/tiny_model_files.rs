//! The tiny synthetic Llama in `assets/tiny-llama/` (made by `make_tiny_llama.py`): both GGUFs
//! and the HF directory load through `ModelFile::open` with the same config (except the RoPE
//! style), the same shapes, and GGUF q/k rows that are exactly llama.cpp's permutation of HF's.

use kvrun::loader::{ModelFile, RopeStyle, SourceFormat};
use kvrun::quant::GgmlType;
use kvrun::tokenizer::{ChatMessage, Tokenizer};
use std::path::PathBuf;

fn tiny(rel: &str) -> ModelFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-llama").join(rel);
    ModelFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

const LINEAR: [&str; 7] =
    ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"];

/// The HF row that GGUF row `r` of a permuted q/k weight came from. llama.cpp's `permute`
/// reshapes each head's rows as [2, head_dim/2] and transposes to [head_dim/2, 2]: GGUF row
/// (head h, pair i, member j) is HF row (head h, half j, index i).
fn hf_row_of_gguf_row(r: usize, head_dim: usize) -> usize {
    let (head, within) = (r / head_dim, r % head_dim);
    head * head_dim + (within % 2) * (head_dim / 2) + within / 2
}

#[test]
fn configs_agree_except_rope_style() {
    let hf = tiny("hf");
    let f32 = tiny("tiny-llama-f32.gguf");
    let q = tiny("tiny-llama-q.gguf");
    assert_eq!(hf.format(), SourceFormat::HfSafetensors);
    assert_eq!(f32.format(), SourceFormat::Gguf);
    assert_eq!(hf.config().rope_style, RopeStyle::Neox);
    assert_eq!(f32.config().rope_style, RopeStyle::Interleaved);
    let mut expected = hf.config().clone();
    expected.rope_style = RopeStyle::Interleaved;
    assert_eq!(f32.config(), &expected);
    assert_eq!(q.config(), &expected);
    let c = hf.config();
    assert_eq!(
        (c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim),
        (2, 64, 4, 2, 16)
    );
    assert_eq!((c.intermediate_size, c.vocab_size, c.max_position_embeddings), (128, 256, 256));
    assert!(!c.tie_word_embeddings && !c.attention_bias);
    assert_eq!(hf.hf_extras().unwrap().torch_dtype.as_deref(), Some("float32"));
}

#[test]
fn shapes_and_types() {
    let hf = tiny("hf");
    let f32 = tiny("tiny-llama-f32.gguf");
    let q = tiny("tiny-llama-q.gguf");
    let shapes = [
        ("token_embd.weight", vec![256, 64]),
        ("output.weight", vec![256, 64]),
        ("output_norm.weight", vec![64]),
        ("blk.1.attn_norm.weight", vec![64]),
        ("blk.1.attn_q.weight", vec![64, 64]),
        ("blk.1.attn_k.weight", vec![32, 64]),
        ("blk.1.attn_v.weight", vec![32, 64]),
        ("blk.1.attn_output.weight", vec![64, 64]),
        ("blk.1.ffn_gate.weight", vec![128, 64]),
        ("blk.1.ffn_down.weight", vec![64, 128]),
    ];
    for m in [&hf, &f32, &q] {
        assert_eq!(m.tensor_names().len(), 3 + 2 * 9);
        for (name, shape) in &shapes {
            assert_eq!(&m.tensor(name).unwrap().shape, shape, "{name}");
        }
    }
    let types = [
        ("token_embd.weight", GgmlType::Q8_0),
        ("blk.0.attn_q.weight", GgmlType::Q8_0),
        ("blk.0.attn_output.weight", GgmlType::F16),
        ("blk.0.ffn_up.weight", GgmlType::Q4_1),
        ("blk.1.attn_k.weight", GgmlType::Q4_0),
        ("blk.1.ffn_norm.weight", GgmlType::F32),
    ];
    for (name, ty) in types {
        assert_eq!(q.tensor(name).unwrap().dtype, ty, "{name}");
        assert_eq!(hf.tensor(name).unwrap().dtype, GgmlType::F32);
    }
    assert_eq!(hf.weight_bytes(), f32.weight_bytes());
    assert!(q.weight_bytes() < f32.weight_bytes() / 3);
}

#[test]
fn gguf_qk_rows_are_the_llama_cpp_permutation_of_hf() {
    let hf = tiny("hf");
    let f32 = tiny("tiny-llama-f32.gguf");
    let head_dim = hf.config().head_dim;
    for layer in 0..2 {
        for kind in LINEAR {
            let name = format!("blk.{layer}.{kind}.weight");
            let (h, g) = (hf.tensor(&name).unwrap(), f32.tensor(&name).unwrap());
            let row_bytes = h.shape[1] * 4;
            let permuted = kind == "attn_q" || kind == "attn_k";
            for r in 0..h.shape[0] {
                let hf_r = if permuted { hf_row_of_gguf_row(r, head_dim) } else { r };
                assert_eq!(
                    &g.data[r * row_bytes..(r + 1) * row_bytes],
                    &h.data[hf_r * row_bytes..(hf_r + 1) * row_bytes],
                    "{name}: GGUF row {r} vs HF row {hf_r}"
                );
            }
            if permuted {
                assert_ne!(g.data, h.data, "{name} should be permuted");
            }
        }
    }
    for name in ["token_embd.weight", "output.weight", "output_norm.weight"] {
        assert_eq!(hf.tensor(name).unwrap().data, f32.tensor(name).unwrap().data);
    }
}

#[test]
fn quantized_weights_are_close_to_f32() {
    let f32 = tiny("tiny-llama-f32.gguf");
    let q = tiny("tiny-llama-q.gguf");
    for name in f32.tensor_names() {
        let (a, b) = (f32.tensor(name).unwrap(), q.tensor(name).unwrap());
        let (a, b) = (a.to_f32().unwrap(), b.to_f32().unwrap());
        let max_abs = a.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = a.iter().zip(&b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(worst <= 0.2 * max_abs, "{name}: error {worst} vs range {max_abs}");
    }
}

#[test]
fn golden_logits_file_is_complete() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-llama/golden.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let ids = golden["token_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 40);
    assert!(ids.iter().all(|v| v.as_u64().unwrap() < 256));
    for variant in ["hf_f32", "gguf_q"] {
        let rows = golden["logits"][variant].as_array().unwrap();
        assert_eq!(rows.len(), 40, "{variant}");
        assert!(rows.iter().all(|r| r.as_array().unwrap().len() == 256), "{variant}");
    }
}

#[test]
fn both_tokenizers_agree_and_the_template_renders() {
    let from_hf = Tokenizer::from_source(tiny("hf").tokenizer_source().unwrap()).unwrap();
    let from_gguf =
        Tokenizer::from_source(tiny("tiny-llama-q.gguf").tokenizer_source().unwrap()).unwrap();
    let text = "Hi there, 42 naïve 🦀\n\t<|im_start|>";
    let ids = from_hf.encode(text, true).unwrap();
    assert_eq!(ids.len(), text.len()); // one token per byte
    assert_eq!(ids, from_gguf.encode(text, true).unwrap());
    assert_eq!(from_gguf.decode(&ids, true).unwrap(), text);
    assert_eq!((from_hf.vocab_size(), from_gguf.vocab_size()), (256, 256));
    for tok in [&from_hf, &from_gguf] {
        let chat = tok.chat_template().unwrap().unwrap();
        let prompt = chat.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(prompt, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }
}
