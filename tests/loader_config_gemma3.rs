//! Gemma 3 and Mistral-window configs: HF (flat, `text_config` with omitted defaults, the
//! transformers ≥ 5 `rope_parameters`) and GGUF metadata (llama.cpp's rules).

use kvrun::loader::{
    Activation, Architecture, AttentionKind, GgufFile, GgufValue, GgufValueType, GgufWriter,
    LayerSpec, LoadError, ModelConfig, Rope, RopeScaling, RopeStyle,
};

fn fixture(name: &str) -> (ModelConfig, kvrun::loader::HfConfigExtras) {
    let path = format!("{}/assets/configs/{name}/config.json", env!("CARGO_MANIFEST_DIR"));
    ModelConfig::from_hf_config_json_with_extras(&std::fs::read_to_string(path).unwrap()).unwrap()
}

const LOCAL: Rope = Rope { theta: 10_000.0, scaling: RopeScaling::None };

fn local(window: usize) -> LayerSpec {
    LayerSpec { attention: AttentionKind::Sliding { window }, rope: LOCAL }
}

fn global(scaling: RopeScaling) -> LayerSpec {
    LayerSpec { attention: AttentionKind::Full, rope: Rope { theta: 1e6, scaling } }
}

/// Five local layers, then one global, repeated (HF `(i + 1) % 6`, llama.cpp `il % 6 == 5`).
fn pattern(num_layers: usize, window: usize, scaling: RopeScaling) -> Vec<LayerSpec> {
    (0..num_layers).map(|i| if i % 6 == 5 { global(scaling) } else { local(window) }).collect()
}

#[test]
fn hf_gemma3_270m_flat() {
    let (c, extras) = fixture("gemma-3-270m");
    assert_eq!((c.arch, c.rope_style), (Architecture::Gemma3, RopeStyle::Neox));
    assert_eq!((c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads), (640, 18, 4, 1));
    assert_eq!((c.head_dim, c.vocab_size, c.max_position_embeddings), (256, 262_144, 32_768));
    assert_eq!(c.layers, pattern(18, 512, RopeScaling::None));
    assert!(c.qk_norm && c.post_norms && c.tie_word_embeddings && !c.attention_bias);
    assert_eq!(c.activation, Activation::GeluTanh);
    assert_eq!(c.embedding_scale, Some(640f32.sqrt()));
    assert_eq!((c.attention_scale, c.norm_weight_offset), (1.0 / 16.0, 1.0));
    assert_eq!(c.distinct_ropes().len(), 2);
    assert_eq!((extras.bos_token_id, extras.eos_token_ids), (Some(2), vec![1]));
}

#[test]
fn hf_gemma3_text_config_with_defaults() {
    let (c, extras) = fixture("gemma-3-4b-it");
    // num_attention_heads, num_key_value_heads, head_dim, vocab_size are Gemma3TextConfig's
    assert_eq!((c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads), (2560, 34, 8, 4));
    assert_eq!((c.head_dim, c.vocab_size, c.max_position_embeddings), (256, 262_208, 131_072));
    // rope_scaling applies to the global layers only
    assert_eq!(c.layers, pattern(34, 1024, RopeScaling::Linear { factor: 8.0 }));
    assert_eq!(c.attention_scale, 1.0 / 16.0);
    assert_eq!(extras.eos_token_ids, vec![1, 106]);
    assert_eq!(extras.torch_dtype.as_deref(), Some("bfloat16"));

    let (c, _) = fixture("gemma-3-27b-it");
    assert_eq!((c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim), (62, 32, 16, 128));
    // query_pre_attn_scalar 168 = 5376 / 32, not head_dim
    assert_eq!(c.attention_scale, (1.0 / 168f64.sqrt()) as f32);
    assert_eq!(c.layers, pattern(62, 1024, RopeScaling::Linear { factor: 8.0 }));
}

#[test]
fn hf_gemma3_rope_parameters_and_refusals() {
    // transformers ≥ 5: one rope dict per layer type, no rope_local_base_freq
    let json = r#"{"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 6,
        "sliding_window": 512, "max_position_embeddings": 32768,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}"#;
    let c = ModelConfig::from_hf_config_json(json).unwrap();
    assert_eq!(c.layers, pattern(6, 512, RopeScaling::Linear { factor: 8.0 }));

    let err = |json: &str| ModelConfig::from_hf_config_json(json).unwrap_err().to_string();
    let e = err(r#"{"architectures": ["Gemma3ForCausalLM"], "hidden_activation": "relu"}"#);
    assert!(e.contains("hidden_activation 'relu'"), "{e}");
    let e = err(r#"{"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 2,
        "layer_types": ["full_attention"]}"#);
    assert!(e.contains("layer_types lists 1 layers but num_hidden_layers = 2"), "{e}");
    let e = err(r#"{"architectures": ["Gemma3ForCausalLM"], "num_hidden_layers": 1,
        "layer_types": ["chunked_attention"]}"#);
    assert!(e.contains("'chunked_attention'"), "{e}");
    let e = err(r#"{"architectures": ["Gemma3ForCausalLM"], "sliding_window": 0}"#);
    assert!(e.contains("sliding window of 0 tokens"), "{e}");
}

fn gguf_gemma3(layers: u32, extra: impl FnOnce(&mut GgufWriter)) -> Result<ModelConfig, LoadError> {
    let mut w = GgufWriter::new();
    w.add_str("general.architecture", "gemma3")
        .add_u32("gemma3.block_count", layers)
        .add_u32("gemma3.context_length", 32_768)
        .add_u32("gemma3.embedding_length", 640)
        .add_u32("gemma3.feed_forward_length", 2048)
        .add_u32("gemma3.attention.head_count", 4)
        .add_u32("gemma3.attention.head_count_kv", 1)
        .add_u32("gemma3.attention.key_length", 256)
        .add_f32("gemma3.attention.layer_norm_rms_epsilon", 1e-6)
        .add_f32("gemma3.rope.freq_base", 1e6)
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
fn gguf_gemma3_metadata() {
    let c = gguf_gemma3(12, |w| {
        w.add_u32("gemma3.attention.sliding_window", 512);
        w.add_str("gemma3.rope.scaling.type", "linear").add_f32("gemma3.rope.scaling.factor", 8.0);
    })
    .unwrap();
    assert_eq!((c.arch, c.rope_style), (Architecture::Gemma3, RopeStyle::Neox));
    assert_eq!(c.layers, pattern(12, 512, RopeScaling::Linear { factor: 8.0 }));
    assert!(c.qk_norm && c.post_norms && c.tie_word_embeddings);
    assert_eq!((c.activation, c.embedding_scale), (Activation::GeluTanh, Some(640f32.sqrt())));
    // the converter already added 1 to the norm weights
    assert_eq!((c.attention_scale, c.norm_weight_offset), (1.0 / 16.0, 0.0));

    // no sliding_window key: every layer is global (llama.cpp LLAMA_SWA_TYPE_NONE)
    let c = gguf_gemma3(6, |_| {}).unwrap();
    assert_eq!(c.layers, vec![global(RopeScaling::None); 6]);

    // 27B (62 layers): 1/sqrt(hidden / heads)
    let c = gguf_gemma3(62, |w| {
        w.add_u32("gemma3.attention.sliding_window", 1024);
    })
    .unwrap();
    assert_eq!(c.attention_scale, (1.0 / 160f64.sqrt()) as f32);
    assert_eq!((c.layers[59], c.layers[61]), (global(RopeScaling::None), local(1024)));
}

/// `rope.dimension_count` below head_dim: partial RoPE on the first channels of each head
/// (llama.cpp's gemma3 graph rotates `n_rot` channels); equal to head_dim is whole heads; more
/// is refused, as are freq factors that do not match the rotated pairs.
#[test]
fn gguf_gemma3_partial_rotary_dims() {
    let c = gguf_gemma3(6, |w| {
        w.add_u32("gemma3.rope.dimension_count", 64);
    })
    .unwrap();
    assert_eq!((c.rotary_dims, c.rope_dim()), (Some(64), 64));
    let c = gguf_gemma3(6, |w| {
        w.add_u32("gemma3.rope.dimension_count", 256);
    })
    .unwrap();
    assert_eq!((c.rotary_dims, c.rope_dim()), (None, 256));
    let err =
        |extra: &dyn Fn(&mut GgufWriter)| gguf_gemma3(6, |w| extra(w)).unwrap_err().to_string();
    let e = err(&|w| {
        w.add_u32("gemma3.rope.dimension_count", 512);
    });
    assert!(e.contains("dimension_count = 512 exceeds head_dim = 256"), "{e}");
    let e = err(&|w| {
        w.add_u32("gemma3.rope.dimension_count", 63);
    });
    assert!(e.contains("63 rotary channels of a 256-channel head"), "{e}");
    let e = err(&|w| {
        w.add_u32("gemma3.rope.dimension_count", 64);
        w.add_f32_tensor("rope_freqs.weight", &[128], &[1.0; 128]).unwrap();
    });
    assert!(e.contains("128 factors for head_dim = 256 (needs one per rotated channel pair, 32"));
}
