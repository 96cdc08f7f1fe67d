//! The loader on the real SmolLM2-135M-Instruct Q4_1 GGUF (skipped when the file is absent).
//! Expected values come from llama.cpp's gguf-py (`GGUFReader` + `quants.dequantize`).

mod common;

use kvrun::loader::{
    Activation, Architecture, AttentionKind, LayerSpec, ModelConfig, ModelFile, Rope, RopeScaling,
    RopeStyle, SourceFormat,
};
use kvrun::quant::GgmlType;

#[test]
fn smollm2_config_and_tensors() {
    let Some(path) = common::real_model("smollm2_config_and_tensors") else {
        return;
    };
    let m = ModelFile::open(&path).unwrap();
    assert_eq!(m.format(), SourceFormat::Gguf);
    assert_eq!(m.gguf().unwrap().version(), 3);
    let expected = ModelConfig {
        arch: Architecture::Llama,
        hidden_size: 576,
        intermediate_size: 1536,
        num_layers: 30,
        num_heads: 9,
        num_kv_heads: 3,
        head_dim: 64,
        vocab_size: 49152,
        rms_norm_eps: 1e-5,
        layers: vec![
            LayerSpec {
                attention: AttentionKind::Full,
                rope: Rope { theta: 100_000.0, scaling: RopeScaling::None }
            };
            30
        ],
        rope_style: RopeStyle::Interleaved,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
        attention_bias: false,
        qk_norm: false,
        activation: Activation::Silu,
        embedding_scale: None,
        post_norms: false,
        attention_scale: 0.125,
        norm_weight_offset: 0.0,
        rope_freq_factors: None,
        mla: None,
        rotary_dims: None,
        moe_layers: 0,
        moe: None,
        delta_net: None,
        attn_output_gate: false,
        global_layers: None,
        final_logit_softcap: None,
    };
    assert_eq!(m.config(), &expected);
    assert_eq!(m.tensor_names().len(), 272);
    assert_eq!(m.weight_bytes(), 96_576_768);
    assert!(!m.has_tensor("output.weight"));

    let embd = m.tensor("token_embd.weight").unwrap();
    assert_eq!((embd.dtype, embd.shape.clone()), (GgmlType::Q8_0, vec![49152, 576]));
    assert_eq!(embd.data.len(), 49152 * 612);
    let k = m.tensor("blk.0.attn_k.weight").unwrap();
    assert_eq!((k.dtype, k.shape.clone()), (GgmlType::Q4_1, vec![192, 576]));
    let down = m.tensor("blk.29.ffn_down.weight").unwrap();
    assert_eq!(down.shape, vec![576, 1536]);
    let norm = m.tensor("output_norm.weight").unwrap();
    assert_eq!((norm.dtype, norm.shape.clone()), (GgmlType::F32, vec![576]));

    let err = m.tensor("blk.30.attn_q.weight").unwrap_err().to_string();
    assert!(err.contains("'blk.30.attn_q.weight'") && err.contains("272 tensors"), "{err}");
}

/// Row 1, first four values, and the f64 sum of the whole tensor, from gguf-py.
#[test]
fn smollm2_dequantized_values_match_gguf_py() {
    let Some(path) = common::real_model("smollm2_dequantized_values_match_gguf_py") else {
        return;
    };
    let m = ModelFile::open(&path).unwrap();
    let cases: [(&str, [f64; 4], f64); 3] = [
        (
            "blk.0.attn_q.weight",
            [-0.1173095703125, -0.1173095703125, -0.19281005859375, 0.26019287109375],
            59.22322082519531,
        ),
        (
            "token_embd.weight",
            [-0.0238037109375, -0.015869140625, -0.0396728515625, 0.015869140625],
            -15353.04449415207,
        ),
        (
            "blk.29.ffn_down.weight",
            [-0.33282470703125, -0.09429931640625, 0.14422607421875, 0.14422607421875],
            49.83570861816406,
        ),
    ];
    for (name, row1, sum) in cases {
        let t = m.tensor(name).unwrap();
        let cols = t.shape[1];
        let values = t.to_f32().unwrap();
        let got: Vec<f64> = values[cols..cols + 4].iter().map(|&v| v as f64).collect();
        assert_eq!(got, row1, "{name}");
        let ours: f64 = values.iter().map(|&v| v as f64).sum();
        assert!((ours - sum).abs() < 1e-6 * sum.abs().max(1.0), "{name}: {ours} vs {sum}");
    }
    let norm = m.tensor("output_norm.weight").unwrap().to_f32().unwrap();
    assert_eq!(norm[1], 1.8203125);
}
