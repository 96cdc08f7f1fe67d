//! `ModelConfig` from HF config.json and from GGUF metadata: defaults, quirks, refusals.

use kvrun::loader::{
    Architecture, AttentionKind, GgufFile, GgufValue, GgufValueType, GgufWriter, LayerSpec,
    LoadError, ModelConfig, MoeScoring, Rope, RopeScaling, RopeStyle,
};

fn full(theta: f64) -> LayerSpec {
    LayerSpec { attention: AttentionKind::Full, rope: Rope { theta, scaling: RopeScaling::None } }
}

fn llama_json(extra: &str) -> String {
    format!(
        r#"{{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
            "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256,
            "rms_norm_eps": 1e-5, "max_position_embeddings": 256{extra}}}"#
    )
}

fn err_of(json: &str) -> String {
    ModelConfig::from_hf_config_json(json).unwrap_err().to_string()
}

#[test]
fn hf_llama_defaults() {
    let (c, extras) = ModelConfig::from_hf_config_json_with_extras(&llama_json(
        r#", "torch_dtype": "bfloat16", "eos_token_id": [128001, 128009], "bos_token_id": 1"#,
    ))
    .unwrap();
    assert_eq!(c.arch, Architecture::Llama);
    assert_eq!(c.rope_style, RopeStyle::Neox);
    assert_eq!((c.num_kv_heads, c.head_dim), (4, 16));
    assert_eq!(c.layers, vec![full(10_000.0); 2]);
    assert!(!c.tie_word_embeddings && !c.attention_bias);
    assert_eq!(extras.torch_dtype.as_deref(), Some("bfloat16"));
    assert_eq!(extras.eos_token_ids, vec![128001, 128009]);
    assert_eq!(extras.bos_token_id, Some(1));
    let c = ModelConfig::from_hf_config_json(&llama_json(
        r#", "num_key_value_heads": 2, "head_dim": 32, "rope_theta": 500000.0,
            "tie_word_embeddings": true, "dtype": "float16", "rope_scaling": null"#,
    ))
    .unwrap();
    assert_eq!((c.num_kv_heads, c.head_dim, c.layers[1]), (2, 32, full(500_000.0)));
    assert!(c.tie_word_embeddings);
}

#[test]
fn hf_qwen2_and_mistral() {
    let qwen = llama_json(
        r#", "use_sliding_window": false, "sliding_window": 32, "num_key_value_heads": 2"#,
    )
    .replace("LlamaForCausalLM", "Qwen2ForCausalLM");
    let c = ModelConfig::from_hf_config_json(&qwen).unwrap();
    assert_eq!(
        (c.arch, c.rope_style, c.attention_bias),
        (Architecture::Qwen2, RopeStyle::Neox, true)
    );

    let mistral = |window: &str| {
        llama_json(&format!(r#", "sliding_window": {window}"#))
            .replace("LlamaForCausalLM", "MistralForCausalLM")
    };
    assert_eq!(
        ModelConfig::from_hf_config_json(&mistral("null")).unwrap().arch,
        Architecture::Llama
    );
    // a window covering every position is full attention
    let c = ModelConfig::from_hf_config_json(&mistral("4096")).unwrap();
    assert!(c.layers.iter().all(|l| l.attention == AttentionKind::Full));
    let c = ModelConfig::from_hf_config_json(&mistral("128")).unwrap();
    assert_eq!(c.layers, vec![sliding(128, 10_000.0); 2]);

    // Qwen2: the window only with use_sliding_window, and only from max_window_layers on
    let qwen = |extra: &str| {
        llama_json(&format!(r#", "sliding_window": 64, "num_hidden_layers": 3{extra}"#))
            .replace(r#""num_hidden_layers": 2, "#, "")
            .replace("LlamaForCausalLM", "Qwen2ForCausalLM")
    };
    let c = ModelConfig::from_hf_config_json(&qwen("")).unwrap();
    assert!(c.layers.iter().all(|l| l.attention == AttentionKind::Full));
    let c = ModelConfig::from_hf_config_json(&qwen(
        r#", "use_sliding_window": true, "max_window_layers": 1"#,
    ))
    .unwrap();
    assert_eq!(c.layers, vec![full(10_000.0), sliding(64, 10_000.0), sliding(64, 10_000.0)]);
}

fn sliding(window: usize, theta: f64) -> LayerSpec {
    LayerSpec { attention: AttentionKind::Sliding { window }, ..full(theta) }
}

/// Qwen3: Q/K norms, no q/k/v biases, an explicit head_dim, as the published 0.6B and 8B
/// configs and the tiny model's converted GGUF (llama.cpp's `qwen3` keys) say.
#[test]
fn qwen3_configs_hf_and_gguf() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets");
    let read = |rel: &str| std::fs::read_to_string(dir.join(rel)).unwrap();
    let c = ModelConfig::from_hf_config_json(&read("configs/qwen3-0.6b/config.json")).unwrap();
    assert_eq!(c.arch, Architecture::Qwen3);
    assert!(c.qk_norm && !c.attention_bias && c.tie_word_embeddings && !c.post_norms);
    assert_eq!((c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim), (1024, 16, 8, 128));
    assert_eq!(c.layers, vec![full(1e6); 28]);
    assert_eq!(c.rope_style, RopeStyle::Neox);
    let c = ModelConfig::from_hf_config_json(&read("configs/qwen3-8b/config.json")).unwrap();
    assert_eq!(
        (c.num_layers, c.num_kv_heads, c.head_dim, c.tie_word_embeddings),
        (36, 8, 128, false)
    );
    let hf = ModelConfig::from_hf_config_json(&read("tiny-qwen3/hf/config.json")).unwrap();
    let gguf = GgufFile::open(&dir.join("tiny-qwen3/tiny-qwen3-f32.gguf")).unwrap();
    let g = ModelConfig::from_gguf(&gguf).unwrap();
    assert_eq!(g.arch, Architecture::Qwen3);
    assert_eq!(g, hf, "the converted GGUF and its HF directory describe one model");
}

#[test]
fn hf_refusals_name_the_problem() {
    let err = err_of(&llama_json("").replace("LlamaForCausalLM", "GPT2LMHeadModel"));
    assert!(err.contains("'GPT2LMHeadModel'") && err.contains("Qwen2ForCausalLM"), "{err}");
    let err = err_of(&llama_json(r#", "num_key_value_heads": 3"#));
    assert!(err.contains("not a multiple of num_kv_heads = 3"), "{err}");
    let err = err_of(&llama_json(r#", "head_dim": 15"#));
    assert!(err.contains("head_dim = 15 is odd"), "{err}");
    let err =
        err_of(&llama_json("").replace(r#""num_hidden_layers": 2"#, r#""num_hidden_layers": 0"#));
    assert!(err.contains("num_layers is 0"), "{err}");
    let err = err_of(&llama_json(r#", "rope_scaling": {"rope_type": "llama3", "factor": 8.0}"#));
    assert!(err.contains("'llama3' needs 'low_freq_factor'"), "{err}");
    let err = err_of(r#"{"architectures": ["LlamaForCausalLM"]}"#);
    assert!(err.contains("missing field"), "{err}");
}

fn gguf_llama(arch: &str, extra: impl FnOnce(&mut GgufWriter)) -> Result<ModelConfig, LoadError> {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", arch)
        .add_u32(&format!("{arch}.block_count"), 2)
        .add_u32(&format!("{arch}.context_length"), 256)
        .add(&format!("{arch}.embedding_length"), GgufValue::U64(64))
        .add_u32(&format!("{arch}.feed_forward_length"), 128)
        .add(&format!("{arch}.attention.head_count"), GgufValue::I32(4))
        .add_f32(&format!("{arch}.attention.layer_norm_rms_epsilon"), 1e-5)
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
fn gguf_defaults_and_quirks() {
    let c = gguf_llama("llama", |_| {}).unwrap();
    assert_eq!(c.rope_style, RopeStyle::Interleaved);
    assert_eq!((c.num_kv_heads, c.head_dim, c.vocab_size), (4, 16, 10));
    assert_eq!(c.layers, vec![full(10_000.0); 2]);
    assert!(c.tie_word_embeddings && !c.attention_bias);

    let c = gguf_llama("qwen2", |w| {
        w.add_u32("qwen2.attention.head_count_kv", 2).add_u32("qwen2.vocab_size", 300);
        w.add_f32_tensor("output.weight", &[1], &[0.0]).unwrap();
        w.add_f32_tensor("blk.0.attn_q.bias", &[64], &[0.0; 64]).unwrap();
    })
    .unwrap();
    assert_eq!((c.arch, c.rope_style), (Architecture::Qwen2, RopeStyle::Neox));
    assert_eq!((c.num_kv_heads, c.vocab_size), (2, 300));
    assert!(!c.tie_word_embeddings && c.attention_bias);
}

#[test]
fn gguf_refusals_name_the_key() {
    let err = gguf_llama("phi3", |_| {}).unwrap_err().to_string();
    assert!(err.contains("'phi3'") && err.contains("Gemma 4"), "{err}");
    let err = gguf_llama("llama", |w| {
        w.add_str("llama.rope.freq_base", "fast");
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("llama.rope.freq_base should be a float"), "{err}");
    let err = gguf_llama("llama", |w| {
        w.add_u32("llama.rope.dimension_count", 8);
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("partial rotary") && err.contains("llama.cpp refuses"), "{err}");
    for arch in ["qwen2", "qwen3"] {
        let err = gguf_llama(arch, |w| {
            w.add_u32(&format!("{arch}.rope.dimension_count"), 8);
        })
        .unwrap_err()
        .to_string();
        assert!(err.contains(&format!("the {arch} architecture rotates whole heads")), "{err}");
    }
    let err = gguf_llama("llama", |w| {
        w.add_f32_tensor("rope_freqs.weight", &[4], &[1.0; 4]).unwrap();
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("rope_freqs.weight has 4 factors for head_dim = 16"), "{err}");
    let err = gguf_llama("llama", |w| {
        w.add_str("llama.rope.scaling.type", "longrope");
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("llama.rope.scaling.type = 'longrope'"), "{err}");
    // Missing required key.
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "llama");
    let err = ModelConfig::from_gguf(&GgufFile::from_bytes(w.to_bytes()).unwrap())
        .unwrap_err()
        .to_string();
    assert!(err.contains("llama.embedding_length is missing"), "{err}");
}

/// DeepSeek-V2-Lite and V3 (assets/configs): MLA's shape as the KV cache and the kernels see it
/// (one latent "head" of 512 + 64, RoPE on the 64, adjacent pairs), YaRN with DeepSeek's
/// softmax scale `1/√(128 + 64) · (0.1 · mscale_all_dim · ln 40 + 1)²`, and the MoE layers
/// (`first_k_dense_replace` dense ones first). A config without an MLA rank is refused by key.
#[test]
fn hf_deepseek_mla_configs() {
    let read = |name: &str| {
        let path = format!("{}/assets/configs/{name}/config.json", env!("CARGO_MANIFEST_DIR"));
        ModelConfig::from_hf_config_json(&std::fs::read_to_string(path).unwrap()).unwrap()
    };
    for (name, layers, heads, q_lora, all_dim, moe) in [
        ("deepseek-v2-lite", 27, 16, None, 0.707, 26),
        ("deepseek-v3", 61, 128, Some(1536), 1.0, 58),
    ] {
        let c = read(name);
        assert_eq!(c.arch, Architecture::Deepseek2, "{name}");
        assert_eq!(
            (c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim),
            (layers, heads, 1, 576)
        );
        let m = c.mla.unwrap();
        assert_eq!(m.q_lora_rank, q_lora, "{name}");
        assert_eq!(
            (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
            (512, 128, 64, 128)
        );
        assert_eq!((c.rope_dim(), c.rope_style, c.moe_layers), (64, RopeStyle::Interleaved, moe));
        // V2-Lite's softmax routing (64 experts of 1408, 6 a token, 2 shared); V3's sigmoid
        // scores with a choice bias (256 of 2048, 8 a token from the best 4 of 8 groups,
        // renormalised, times 2.5, 1 shared)
        let m = c.moe.expect("DeepSeek's experts");
        let shape = (m.experts, m.experts_used, m.expert_ffn, m.shared_ffn);
        match name {
            "deepseek-v2-lite" => {
                assert_eq!(shape, (64, 6, 1408, 2 * 1408));
                assert_eq!((m.first_dense, m.groups, m.norm_topk_prob), (1, 1, false));
                assert_eq!((m.scoring, m.routed_scale), (MoeScoring::Softmax, 1.0));
                assert!(!c.is_moe_layer(0) && (1..27).all(|l| c.is_moe_layer(l)));
            }
            _ => {
                assert_eq!(shape, (256, 8, 2048, 2048));
                assert_eq!(
                    (m.first_dense, m.groups, m.groups_used, m.norm_topk_prob),
                    (3, 8, 4, true)
                );
                assert_eq!((m.scoring, m.routed_scale), (MoeScoring::SigmoidBiased, 2.5));
                assert!(!c.is_moe_layer(2) && (3..61).all(|l| c.is_moe_layer(l)));
            }
        }
        let mscale = 0.1 * all_dim * 40f64.ln() + 1.0;
        let want = (mscale * mscale / 192f64.sqrt()) as f32;
        assert!((c.attention_scale - want).abs() < 1e-6, "{name}: {} vs {want}", c.attention_scale);
        match c.layers[0].rope.scaling {
            // mscale == mscale_all_dim: cos/sin unscaled
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings,
                attention_factor,
                ..
            } => {
                assert_eq!((factor, original_max_position_embeddings), (40.0, 4096));
                assert!((attention_factor - 1.0).abs() < 1e-12, "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let lite = std::fs::read_to_string(format!(
        "{}/assets/configs/deepseek-v2-lite/config.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let broken = lite.replace("\"kv_lora_rank\"", "\"kv_lora_rank_\"");
    assert!(err_of(&broken).contains("needs 'kv_lora_rank'"), "{}", err_of(&broken));
    // a routing DeepSeek does not define (sigmoid scores chosen greedily) is refused by name
    let v3 = std::fs::read_to_string(format!(
        "{}/assets/configs/deepseek-v3/config.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let greedy = v3.replace("\"noaux_tc\"", "\"greedy\"");
    let c = ModelConfig::from_hf_config_json(&greedy).unwrap();
    assert_eq!((c.moe, c.moe_layers), (None, 58));
    let flat = v3.replace("\"rope_scaling\"", "\"rope_interleave\": false, \"rope_scaling\"");
    assert!(err_of(&flat).contains("rope_interleave = false"), "{}", err_of(&flat));
}

/// GGUF `deepseek2`, both converter generations: the current one (key_length = latent width,
/// per-head sizes in `*_mla`) and the older one (per-head sizes in key_length/value_length).
/// DeepSeek's YaRN as llama.cpp runs it: cos/sin unscaled, scores × (1 + log_mul · ln 40)²;
/// layers from `leading_dense_block_count` on are MoE when `expert_count` > 0. A key length
/// not above the RoPE part is refused.
#[test]
fn gguf_deepseek2_both_layouts() {
    let mla = |w: &mut GgufWriter, current: bool| {
        w.add_u32("deepseek2.attention.kv_lora_rank", 96)
            .add_u32("deepseek2.rope.dimension_count", 32);
        if current {
            w.add_u32("deepseek2.attention.key_length", 128)
                .add_u32("deepseek2.attention.value_length", 96)
                .add_u32("deepseek2.attention.key_length_mla", 64)
                .add_u32("deepseek2.attention.value_length_mla", 32)
                .add_u32("deepseek2.attention.q_lora_rank", 32);
        } else {
            w.add_u32("deepseek2.attention.key_length", 64)
                .add_u32("deepseek2.attention.value_length", 32);
        }
    };
    for current in [true, false] {
        let c = gguf_llama("deepseek2", |w| mla(w, current)).unwrap();
        let m = c.mla.unwrap();
        assert_eq!(c.arch, Architecture::Deepseek2);
        assert_eq!((c.num_kv_heads, c.head_dim, c.rope_style), (1, 128, RopeStyle::Interleaved));
        assert_eq!(
            (m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim),
            (96, 32, 32, 32)
        );
        assert_eq!(m.q_lora_rank, current.then_some(32));
        assert_eq!((c.attention_scale, c.moe_layers), (1.0 / 8.0, 0));
    }
    let c = gguf_llama("deepseek2", |w| {
        mla(w, true);
        w.add_str("deepseek2.rope.scaling.type", "yarn")
            .add_f32("deepseek2.rope.scaling.factor", 40.0)
            .add_f32("deepseek2.rope.scaling.yarn_log_multiplier", 0.0707)
            .add_u32("deepseek2.rope.scaling.original_context_length", 4096)
            .add_u32("deepseek2.expert_count", 64)
            .add_u32("deepseek2.expert_used_count", 6)
            .add_u32("deepseek2.expert_feed_forward_length", 1408)
            .add_u32("deepseek2.expert_shared_count", 2)
            .add_u32("deepseek2.leading_dense_block_count", 1);
    })
    .unwrap();
    let m = c.moe.expect("DeepSeek-V2's softmax-routed experts");
    assert_eq!((m.experts, m.experts_used, m.expert_ffn, m.shared_ffn), (64, 6, 1408, 2 * 1408));
    assert_eq!((m.first_dense, m.groups, m.routed_scale, m.norm_topk_prob), (1, 1, 1.0, false));
    assert!(!c.is_moe_layer(0) && c.is_moe_layer(1));
    let mscale = 1.0 + f64::from(0.0707f32) * 40f64.ln();
    assert!((f64::from(c.attention_scale) - mscale * mscale / 8.0).abs() < 1e-6);
    assert!(
        matches!(c.layers[0].rope.scaling, RopeScaling::Yarn { attention_factor, .. } if attention_factor == 1.0)
    );
    assert_eq!(c.moe_layers, 1);
    let err = gguf_llama("deepseek2", |w| {
        w.add_u32("deepseek2.attention.kv_lora_rank", 96)
            .add_u32("deepseek2.rope.dimension_count", 32)
            .add_u32("deepseek2.attention.key_length", 32)
            .add_u32("deepseek2.attention.value_length", 32);
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("must exceed rope.dimension_count"), "{err}");
}
