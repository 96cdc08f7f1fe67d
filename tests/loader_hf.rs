//! HF directories: sharded safetensors with an index, dtypes, config files, and the errors for
//! what is missing or unsupported. Each test writes its own directory under the temp dir.

use kvrun::loader::{canonical_name, canonical_name_for, Architecture, LoadError, ModelFile};
use kvrun::quant::GgmlType;
use kvrun::tokenizer::TokenizerSource;
use safetensors::tensor::TensorView as StView;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

const CONFIG: &str = r#"{"architectures": ["Qwen2ForCausalLM"], "hidden_size": 32,
  "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "vocab_size": 8, "max_position_embeddings": 64,
  "tie_word_embeddings": true, "eos_token_id": 7, "torch_dtype": "bfloat16"}"#;

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kvrun-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn write_shard(path: &Path, tensors: &[(&str, Dtype, Vec<usize>)]) {
    let datas: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, dtype, shape)| {
            let n: usize = shape.iter().product();
            (0..n * dtype.bitsize() / 8).map(|i| i as u8).collect()
        })
        .collect();
    let views: Vec<(&str, StView<'_>)> = tensors
        .iter()
        .zip(&datas)
        .map(|((name, dtype, shape), data)| {
            (*name, StView::new(*dtype, shape.clone(), data).unwrap())
        })
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

/// A one-layer Qwen2 split over two shards.
fn sharded_qwen(name: &str) -> PathBuf {
    let dir = temp_dir(name);
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let shard1 = [
        ("model.embed_tokens.weight", Dtype::BF16, vec![8, 32]),
        ("model.layers.0.input_layernorm.weight", Dtype::F32, vec![32]),
        ("model.layers.0.self_attn.q_proj.weight", Dtype::BF16, vec![32, 32]),
        ("model.layers.0.self_attn.q_proj.bias", Dtype::BF16, vec![32]),
    ];
    let shard2 = [
        ("model.layers.0.self_attn.k_proj.weight", Dtype::F16, vec![16, 32]),
        ("model.layers.0.mlp.down_proj.weight", Dtype::BF16, vec![32, 64]),
        ("model.norm.weight", Dtype::F32, vec![32]),
    ];
    write_shard(&dir.join("model-00001-of-00002.safetensors"), &shard1);
    write_shard(&dir.join("model-00002-of-00002.safetensors"), &shard2);
    let mut map = serde_json::Map::new();
    for (n, _, _) in &shard1 {
        map.insert(n.to_string(), "model-00001-of-00002.safetensors".into());
    }
    for (n, _, _) in &shard2 {
        map.insert(n.to_string(), "model-00002-of-00002.safetensors".into());
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    dir
}

#[test]
fn hf_names_map_to_canonical() {
    assert_eq!(canonical_name("model.embed_tokens.weight"), "token_embd.weight");
    assert_eq!(canonical_name("lm_head.weight"), "output.weight");
    assert_eq!(canonical_name("model.norm.weight"), "output_norm.weight");
    assert_eq!(canonical_name("model.layers.11.input_layernorm.weight"), "blk.11.attn_norm.weight");
    assert_eq!(
        canonical_name("model.layers.3.post_attention_layernorm.weight"),
        "blk.3.ffn_norm.weight"
    );
    assert_eq!(canonical_name("model.layers.0.self_attn.v_proj.bias"), "blk.0.attn_v.bias");
    assert_eq!(
        canonical_name("model.layers.0.self_attn.o_proj.weight"),
        "blk.0.attn_output.weight"
    );
    assert_eq!(canonical_name("model.layers.2.mlp.gate_proj.weight"), "blk.2.ffn_gate.weight");
    assert_eq!(
        canonical_name("model.layers.2.rotary_emb.inv_freq"),
        "model.layers.2.rotary_emb.inv_freq"
    );
}

/// Qwen3's per-head norms; Gemma 3's four norms a layer (its `post_attention_layernorm` is the
/// norm after attention, not before the MLP as in Llama) and the text model's prefixes inside
/// `Gemma3ForConditionalGeneration` (transformers 5 and 4), as llama.cpp's converter names them.
#[test]
fn qwen3_and_gemma3_names_map_to_canonical() {
    let qwen3 = |n: &str| canonical_name_for(Architecture::Qwen3, n);
    assert_eq!(qwen3("model.layers.1.self_attn.q_norm.weight"), "blk.1.attn_q_norm.weight");
    assert_eq!(qwen3("model.layers.1.self_attn.k_norm.weight"), "blk.1.attn_k_norm.weight");
    assert_eq!(qwen3("model.layers.1.post_attention_layernorm.weight"), "blk.1.ffn_norm.weight");
    let gemma = |n: &str| canonical_name_for(Architecture::Gemma3, n);
    for prefix in ["model.", "model.language_model.", "language_model.model."] {
        let name = |rest: &str| gemma(&format!("{prefix}{rest}"));
        assert_eq!(name("layers.2.input_layernorm.weight"), "blk.2.attn_norm.weight");
        assert_eq!(
            name("layers.2.post_attention_layernorm.weight"),
            "blk.2.post_attention_norm.weight"
        );
        assert_eq!(name("layers.2.pre_feedforward_layernorm.weight"), "blk.2.ffn_norm.weight");
        assert_eq!(
            name("layers.2.post_feedforward_layernorm.weight"),
            "blk.2.post_ffw_norm.weight"
        );
        assert_eq!(name("layers.2.self_attn.q_norm.weight"), "blk.2.attn_q_norm.weight");
        assert_eq!(name("layers.2.mlp.down_proj.weight"), "blk.2.ffn_down.weight");
        assert_eq!(name("embed_tokens.weight"), "token_embd.weight");
        assert_eq!(name("norm.weight"), "output_norm.weight");
    }
    assert_eq!(gemma("language_model.lm_head.weight"), "output.weight");
    // the vision tower keeps its names (unused)
    let vision = "model.vision_tower.vision_model.post_layernorm.weight";
    assert_eq!(gemma(vision), vision);
}

#[test]
fn sharded_directory_loads_with_canonical_names() {
    let dir = sharded_qwen("sharded");
    let m = ModelFile::open_partial(&dir).unwrap();
    let c = m.config();
    assert!(c.attention_bias && c.tie_word_embeddings);
    assert_eq!(m.hf_extras().unwrap().torch_dtype.as_deref(), Some("bfloat16"));
    let q = m.tensor("blk.0.attn_q.weight").unwrap();
    assert_eq!((q.dtype, q.shape.clone(), q.data.len()), (GgmlType::BF16, vec![32, 32], 2048));
    assert_eq!(&q.data[..4], &[0, 1, 2, 3]);
    let k = m.tensor("blk.0.attn_k.weight").unwrap();
    assert_eq!((k.dtype, k.shape.clone()), (GgmlType::F16, vec![16, 32]));
    assert!(m.has_tensor("blk.0.attn_q.bias") && m.has_tensor("output_norm.weight"));
    assert!(!m.has_tensor("output.weight"));
    assert_eq!(m.tensor_names().len(), 7);
    assert_eq!(m.weight_bytes(), 512 + 128 + 2048 + 64 + 1024 + 4096 + 128);
    let err = m.tensor("blk.0.ffn_up.weight").unwrap_err();
    assert!(matches!(err, LoadError::MissingTensor { .. }));
    assert!(err.to_string().contains("'blk.0.ffn_up.weight'"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn tokenizer_files_are_collected() {
    let dir = sharded_qwen("tokfiles");
    let err = ModelFile::open_partial(&dir).unwrap().tokenizer_source().unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    std::fs::write(dir.join("tokenizer.json"), "{}").unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"eos_token": {"content": "<|im_end|>"}, "bos_token": null}"#,
    )
    .unwrap();
    std::fs::write(dir.join("chat_template.jinja"), "{{ messages }}").unwrap();
    std::fs::write(dir.join("generation_config.json"), r#"{"eos_token_id": [7, 5]}"#).unwrap();
    let TokenizerSource::HfJson { tokenizer_json, config } =
        ModelFile::open_partial(&dir).unwrap().tokenizer_source().unwrap()
    else {
        panic!("expected an HF tokenizer source");
    };
    assert_eq!(tokenizer_json, dir.join("tokenizer.json"));
    let config = config.unwrap();
    assert_eq!(config.eos_token.as_deref(), Some("<|im_end|>"));
    assert_eq!(config.chat_template.as_deref(), Some("{{ messages }}"));
    assert_eq!(config.extra_eos_ids, vec![7, 5]);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn missing_and_unsupported_inputs_explain_the_fix() {
    let dir = temp_dir("bad");
    std::fs::write(dir.join("config.json"), CONFIG).unwrap();
    let err = ModelFile::open(&dir).err().unwrap().to_string();
    assert!(err.contains("neither model.safetensors nor"), "{err}");

    write_shard(&dir.join("model.safetensors"), &[("model.norm.weight", Dtype::I64, vec![4])]);
    let err = ModelFile::open(&dir).err().unwrap().to_string();
    assert!(err.contains("dtype I64") && err.contains("F32, F16 and BF16"), "{err}");

    std::fs::write(dir.join("model.safetensors"), b"\x10\0\0\0\0\0\0\0{").unwrap();
    let err = ModelFile::open(&dir).err().unwrap().to_string();
    assert!(err.contains("re-download"), "{err}");

    std::fs::write(dir.join("config.json"), CONFIG.replace("Qwen2", "Phi3")).unwrap();
    let err = ModelFile::open(&dir).err().unwrap().to_string();
    assert!(err.contains("'Phi3ForCausalLM' is not supported"), "{err}");

    let err = ModelFile::open(&dir.join("config.json")).err().unwrap().to_string();
    assert!(err.contains("HF model directory"), "{err}");
    let err = ModelFile::open(&dir.join("nope.gguf")).err().unwrap().to_string();
    assert!(err.contains("nope.gguf"), "{err}");
    std::fs::write(dir.join("x.gguf"), b"not a gguf").unwrap();
    let err = ModelFile::open(&dir.join("x.gguf")).err().unwrap().to_string();
    assert!(err.contains("not a GGUF file"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}

/// gpt-oss's MXFP4 checkpoint (`assets/tiny-gpt-oss/hf-mxfp4`) copied with one thing changed:
/// `edit` gets every tensor (name, dtype, shape, bytes) and returns the ones to write.
fn edited_mxfp4(
    name: &str,
    edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>),
) -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/tiny-gpt-oss/hf-mxfp4");
    let dir = temp_dir(name);
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.dtype(), v.shape().to_vec(), v.data().to_vec()))
        .collect();
    edit(&mut tensors);
    let views: Vec<(&str, StView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), StView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap())
        .unwrap();
    dir
}

/// An MXFP4 checkpoint with a missing, misshapen or mistyped expert tensor is refused by the
/// tensor's name; U8 is read only as MXFP4's codes and scales; the unchanged copy opens.
#[test]
fn gpt_oss_mxfp4_checkpoints_with_bad_experts_are_refused() {
    let scales = "model.layers.1.mlp.experts.down_proj_scales";
    let blocks = "model.layers.2.mlp.experts.gate_up_proj_blocks";
    let dir = edited_mxfp4("mxfp4-drop", |t| t.retain(|(n, ..)| n != scales));
    let err = ModelFile::open(&dir).err().unwrap().to_string();
    assert!(err.contains("blk.1.hf_down_proj_scales"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    let dir = edited_mxfp4("mxfp4-shape", |t| {
        let b = t.iter_mut().find(|(n, ..)| n == blocks).unwrap();
        // [16, 64, 2, 16] → [16, 64, 4, 8]: the same bytes, blocks of 8
        b.2 = vec![16, 64, 4, 8];
    });
    let err = ModelFile::open(&dir).err().unwrap().to_string();
    assert!(
        err.contains("blk.2.hf_gate_up_proj_blocks") && err.contains("[16, 64, 4, 8]"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    let dir = edited_mxfp4("mxfp4-dtype", |t| {
        let b = t.iter_mut().find(|(n, ..)| n == blocks).unwrap();
        b.1 = Dtype::I8;
    });
    let err = ModelFile::open(&dir).err().unwrap().to_string();
    assert!(err.contains(blocks) && err.contains("dtype I8"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    let dir = edited_mxfp4("mxfp4-u8", |t| {
        let b = t.iter_mut().find(|(n, ..)| n == "model.layers.0.self_attn.sinks").unwrap();
        b.1 = Dtype::U8;
        b.2 = vec![b.3.len()];
    });
    let err = ModelFile::open(&dir).err().unwrap().to_string();
    assert!(err.contains("model.layers.0.self_attn.sinks") && err.contains("dtype U8"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    let dir = edited_mxfp4("mxfp4-same", |_| {});
    ModelFile::open(&dir).unwrap();
    std::fs::remove_dir_all(dir).unwrap();
}
