//! RoPE scaling: HF `rope_scaling` / GGUF `rope.scaling.*` parsing, and the scaled tables vs
//! numpy float64 from HF's `modeling_rope_utils` definitions
//! (`assets/fixtures/rope_scaling/make_rope_scaling.py` → `golden.json`).

use kvrun::kernels::rope::{inv_freqs, rope_table, rope_table_with_freq_factors};
use kvrun::loader::{GgufFile, GgufValue, GgufValueType, GgufWriter, ModelConfig, RopeScaling};
use serde_json::Value;

fn llama_json(theta: f64, scaling: &str) -> String {
    format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 256, "intermediate_size": 512,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
            "max_position_embeddings": 4096, "rope_theta": {theta:?},
            "rope_scaling": {scaling}}}"#
    )
}

fn golden() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/assets/fixtures/rope_scaling/golden.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect()
}

#[test]
fn scaled_tables_match_numpy_float64() {
    let g = golden();
    let head_dim = g["head_dim"].as_u64().unwrap() as usize;
    let positions: Vec<usize> =
        g["positions"].as_array().unwrap().iter().map(|p| p.as_u64().unwrap() as usize).collect();
    for case in g["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let json =
            llama_json(case["rope_theta"].as_f64().unwrap(), &case["rope_scaling"].to_string());
        let c = ModelConfig::from_hf_config_json(&json).unwrap();
        let rope = c.layers[0].rope;
        assert_ne!(rope.scaling, RopeScaling::None, "{name}");
        assert!(c.layers.iter().all(|l| l.rope == rope));
        // same f64 formulas in another order: a few ulps
        for (j, (got, want)) in
            inv_freqs(head_dim, &rope).iter().zip(floats(&case["inv_freq"])).enumerate()
        {
            assert!((got - want).abs() <= 1e-12 * want, "{name} inv_freq[{j}]: {got} vs {want}");
        }
        let table = rope_table(head_dim, &rope, 4096);
        let half = head_dim / 2;
        for (name_part, idx) in [("cos", 0), ("sin", 1)] {
            let rows = case[name_part].as_array().unwrap();
            for (row, &pos) in rows.iter().zip(&positions) {
                for (j, want) in floats(row).into_iter().enumerate() {
                    let got = f64::from(table[pos * half + j][idx]);
                    // f32 rounding of a value of magnitude ≤ attention_factor, plus angle error
                    // ≤ pos · 1e-12 relative
                    assert!(
                        (got - want).abs() <= 2e-7,
                        "{name} {name_part}[pos {pos}][{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}

#[test]
fn freq_factors_divide_the_frequencies() {
    let rope =
        ModelConfig::from_hf_config_json(&llama_json(10_000.0, "null")).unwrap().layers[0].rope;
    let factors: Vec<f32> = (0..32).map(|j| 1.0 + j as f32).collect();
    let table = rope_table_with_freq_factors(64, &rope, Some(&factors), 8);
    let plain = inv_freqs(64, &rope);
    for j in 0..32 {
        let angle = 5.0 * plain[j] / f64::from(factors[j]);
        assert!((f64::from(table[5 * 32 + j][1]) - angle.sin()).abs() < 1e-7);
    }
}

#[test]
fn hf_rope_scaling_parsing_and_refusals() {
    let parse = |s: &str| ModelConfig::from_hf_config_json(&llama_json(10_000.0, s));
    let rope = |s: &str| parse(s).unwrap().layers[0].rope.scaling;
    assert_eq!(rope("null"), RopeScaling::None);
    assert_eq!(rope(r#"{"rope_type": "default"}"#), RopeScaling::None);
    assert_eq!(rope(r#"{"type": "linear", "factor": 2}"#), RopeScaling::Linear { factor: 2.0 });
    // YaRN defaults: original = max_position_embeddings, betas 32 / 1, 0.1 ln(factor) + 1
    assert_eq!(
        rope(r#"{"rope_type": "yarn", "factor": 4.0}"#),
        RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 4096,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 0.1 * 4f64.ln() + 1.0,
            truncate: true,
        }
    );
    let err = |s: &str| parse(s).unwrap_err().to_string();
    let e = err(r#"{"rope_type": "dynamic", "factor": 2.0}"#);
    assert!(e.contains("'dynamic'") && e.contains("llama3"), "{e}");
    let e = err(r#"{"rope_type": "longrope", "long_factor": [1.0]}"#);
    assert!(e.contains("'longrope'"), "{e}");
    let e = err(r#"{"rope_type": "linear", "factor": -2.0}"#);
    assert!(e.contains("rope_scaling.factor = -2.0"), "{e}");
    let e = err(r#"{"rope_type": "linear", "factor": "8"}"#);
    assert!(e.contains("rope_scaling.factor = \"8\""), "{e}");
    let e = err(r#"{"rope_type": "linear"}"#);
    assert!(e.contains("'linear' needs 'factor'"), "{e}");
    let e = err(r#"{"factor": 2.0}"#);
    assert!(e.contains("no rope_type"), "{e}");
    let e =
        err(r#"{"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1,
            "original_max_position_embeddings": 8192}"#);
    assert!(e.contains("high_freq_factor > low_freq_factor"), "{e}");
    // truncate false (gpt-oss) keeps the ramp's fractional ends
    let untruncated = rope(r#"{"rope_type": "yarn", "factor": 4, "truncate": false}"#);
    assert!(matches!(untruncated, RopeScaling::Yarn { truncate: false, .. }), "{untruncated:?}");
}

fn gguf_llama(
    extra: impl FnOnce(&mut GgufWriter),
) -> Result<ModelConfig, kvrun::loader::LoadError> {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama")
        .add_u32("llama.block_count", 2)
        .add_u32("llama.context_length", 4096)
        .add_u32("llama.embedding_length", 256)
        .add_u32("llama.feed_forward_length", 512)
        .add_u32("llama.attention.head_count", 4)
        .add_f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .add(
            "tokenizer.ggml.tokens",
            GgufValue::array(
                GgufValueType::String,
                (0..10).map(|i| GgufValue::String(i.to_string())).collect(),
            ),
        );
    extra(&mut w);
    ModelConfig::from_gguf(&GgufFile::from_bytes(w.to_bytes()).unwrap())
}

#[test]
fn gguf_rope_scaling_keys() {
    let c = gguf_llama(|w| {
        w.add_str("llama.rope.scaling.type", "linear").add_f32("llama.rope.scaling.factor", 4.0);
    })
    .unwrap();
    assert_eq!(c.layers[1].rope.scaling, RopeScaling::Linear { factor: 4.0 });
    let c = gguf_llama(|w| {
        w.add_str("llama.rope.scaling.type", "yarn")
            .add_f32("llama.rope.scaling.factor", 4.0)
            .add_u32("llama.rope.scaling.original_context_length", 1024);
    })
    .unwrap();
    assert_eq!(
        c.layers[0].rope.scaling,
        RopeScaling::Yarn {
            factor: 4.0,
            original_max_position_embeddings: 1024,
            beta_fast: 32.0,
            beta_slow: 1.0,
            attention_factor: 0.1 * 4f64.ln() + 1.0,
            truncate: true,
        }
    );
    // Llama 3.1: the converter's precomputed factors
    let factors: Vec<f32> = (0..32).map(|j| 1.0 + j as f32 / 4.0).collect();
    let c = gguf_llama(|w| {
        w.add_f32_tensor("rope_freqs.weight", &[32], &factors).unwrap();
    })
    .unwrap();
    assert_eq!(c.rope_freq_factors.as_deref(), Some(&factors[..]));
    assert_eq!(c.layers[0].rope.scaling, RopeScaling::None);

    let e = gguf_llama(|w| {
        w.add_str("llama.rope.scaling.type", "linear");
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("llama.rope.scaling.factor is missing"), "{e}");
    let e = gguf_llama(|w| {
        w.add_str("llama.rope.scaling.type", "linear").add_f32("llama.rope.scaling.factor", -1.0);
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("out of range"), "{e}");
    let e = gguf_llama(|w| {
        w.add_f32_tensor("rope_freqs.weight", &[32], &[0.0; 32]).unwrap();
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("all positive"), "{e}");
}
