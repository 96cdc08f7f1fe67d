//! The whole Gemma 4 (dense text) forward on the GPU against transformers' own
//! `modeling_gemma4.py` in float64 (`assets/tiny-gemma4/make_tiny_gemma4.py`) and llama.cpp:
//! a tiny random model of 6 layers (sliding, sliding, global, sliding, sliding, global; window
//! 11), 4 query heads; sliding layers with 4 KV heads of 32 channels, global layers with 1 KV
//! head of 64 and K = V (no V projection), half a sliding layer's KV a token, so the two
//! global layers share one pool slot (`KvGroups::layer_place`); proportional RoPE on the global layers (a quarter
//! of each head turns), attention scale 1, V normed without a weight, a per-layer output scale,
//! a final logit soft-cap of 5, plain `x · w` norms. As the HF directory and as the f32 and
//! Q8_0 GGUFs llama.cpp's converter wrote from it: one prefill, chunks that start mid-window,
//! decode steps, both kernel families, each run bit-identical to the others; 120 tokens past
//! the window; perplexity against transformers and llama-perplexity.

mod common;

use common::*;
use kvrun::kernels::KernelFamily;
use kvrun::loader::{Architecture, AttentionKind, GlobalLayers, ModelFile, RopeScaling};
use std::path::PathBuf;

const DIR: &str = "assets/tiny-gemma4";

fn file(rel: &str) -> ModelFile {
    ModelFile::open(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(DIR).join(rel)).unwrap()
}

/// The three files and the golden variant each is checked against.
const FILES: [(&str, &str); 3] =
    [("hf", "hf_f32"), ("tiny-gemma4-f32.gguf", "hf_f32"), ("tiny-gemma4-q8_0.gguf", "gguf_q8_0")];

/// The model for contexts of `max_len` tokens in blocks of `bs` with the engine's KV-cache
/// groups, one shuffled block table per group; `None` without a GPU.
fn load(
    f: &ModelFile,
    family: KernelFamily,
    (max_len, bs): (usize, usize),
    seed: u64,
) -> Option<(kvrun::model::Model, Vec<Vec<u32>>)> {
    let groups = kvrun::engine::kv_groups(f.config(), max_len);
    load_grouped(f, family, &groups, (max_len, bs), seed)
}

/// What the loader reads from the HF config and from the GGUF metadata alike.
#[test]
fn config_from_hf_and_gguf() {
    for (rel, _) in FILES {
        let f = file(rel);
        let c = f.config();
        let what = format!("{rel}: {c:?}");
        assert_eq!((c.arch, c.num_layers, c.num_heads), (Architecture::Gemma4, 6, 4), "{what}");
        assert_eq!((c.num_kv_heads, c.head_dim), (4, 32), "{what}");
        let global = GlobalLayers { num_kv_heads: 1, head_dim: 64, values_from_keys: true };
        assert_eq!(c.global_layers, Some(global), "{what}");
        let sliding = AttentionKind::Sliding { window: 11 };
        let kinds: Vec<_> = c.layers.iter().map(|l| l.attention).collect();
        let full = AttentionKind::Full;
        assert_eq!(kinds, [sliding, sliding, full, sliding, sliding, full], "{what}");
        assert_eq!(c.layers[0].rope.theta, 10_000.0, "{what}");
        assert_eq!(c.layers[0].rope.scaling, RopeScaling::None, "{what}");
        assert_eq!(c.layers[2].rope.theta, 1e6, "{what}");
        let proportional = RopeScaling::Proportional { partial_rotary_factor: 0.25, factor: 1.0 };
        assert_eq!(c.layers[2].rope.scaling, proportional, "{what}");
        assert_eq!(c.layer_heads(2), (1, 64), "{what}");
        assert_eq!(c.head_shapes(), [(4, 32), (1, 64)], "{what}");
        // a global layer's heads fill half a block sized for the sliding layers': two a slot
        assert_eq!(kvrun::model::layers_per_slot(c), [1, 1, 2, 1, 1, 2], "{what}");
        let groups = kvrun::engine::kv_groups(c, 64);
        assert_eq!(groups.layer_slot(2), groups.layer_slot(5), "{what}: one slot");
        assert_eq!((groups.layer_place(2), groups.layer_place(5)), (0, 1), "{what}");
        assert_eq!((groups.len(), groups.num_padding_slots()), (5, 0), "{what}");
        assert_eq!((c.attention_scale, c.norm_weight_offset), (1.0, 0.0), "{what}");
        assert_eq!(c.final_logit_softcap, Some(5.0), "{what}");
        assert!(c.rope_freq_factors.is_none(), "{what}: rope_freqs became the global RoPE");
    }
}

/// Each file against its golden logits: one prefill, chunks that start mid-window, a prefill
/// then decode steps, both kernel families, the runs bit-identical.
#[test]
fn gemma4_matches_transformers_as_directory_and_converted_gguf() {
    let (tokens, vocab, g) = read_golden(&format!("{DIR}/golden.json"));
    let (max_len, bs) = (64, 8);
    for (rel, variant) in FILES {
        let f = file(rel);
        let want = golden_logits(&g, variant);
        for family in [KernelFamily::Auto, KernelFamily::Gpu] {
            let Some((mut model, tables)) = load(&f, family, (max_len, bs), 11) else { return };
            let mut runs = Vec::new();
            let mut steps = vec![27];
            steps.extend(std::iter::repeat_n(1, 13));
            for chunks in [vec![40], vec![13, 1, 26], steps] {
                let out = run_grouped(&mut model, &tokens, &chunks, &tables, bs);
                check_logits(&format!("Gemma 4 {rel} {family:?} {chunks:?}"), &out, &want, vocab);
                runs.push(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
            assert!(runs.iter().all(|r| *r == runs[0]), "{rel} {family:?}: chunking changed bits");
        }
    }
}

/// 120 tokens, eleven windows: the sliding layers roll their blocks in their own groups beside
/// the global layers' wider heads in the same pool blocks; block sizes 16 and 5.
#[test]
fn past_the_window_with_two_head_shapes_in_one_pool() {
    let (tokens, vocab, g) = read_golden(&format!("{DIR}/golden-long.json"));
    let want = golden_logits(&g, "hf_f32");
    for (rel, bs) in [("hf", 16), ("tiny-gemma4-f32.gguf", 5)] {
        let f = file(rel);
        for family in [KernelFamily::Auto, KernelFamily::Gpu] {
            let Some((mut model, tables)) = load(&f, family, (128, bs), 5) else { return };
            let mut runs = Vec::new();
            let mut steps = vec![60];
            steps.extend(std::iter::repeat_n(1, 60));
            for chunks in [vec![120], vec![37, 50, 33], steps] {
                let out = run_grouped(&mut model, &tokens, &chunks, &tables, bs);
                check_logits(&format!("Gemma 4 long {rel} {family:?} bs {bs}"), &out, &want, vocab);
                runs.push(out.iter().map(|x| x.to_bits()).collect::<Vec<_>>());
            }
            assert!(runs.iter().all(|r| *r == runs[0]), "{rel} {family:?}: chunking changed bits");
        }
    }
}

/// Perplexity of `make_tiny_gemma4.py`'s text (4 chunks of 128 tokens: the sliding layers
/// slide; llama.cpp's convention, a BOS first): the HF directory and the f32 GGUF within 0.01 %
/// of transformers' float64 forward and of llama.cpp's llama-perplexity (284.3515 / 284.3443),
/// the Q8_0 GGUF within 0.01 % of transformers on its dequantized weights (283.0607) and
/// 0.5 % of llama.cpp (283.4350: llama.cpp rounds a Q8_0 product's activations to 8 bits).
#[test]
fn gemma4_perplexity_matches_transformers_and_llama_cpp() {
    check_tiny_perplexity(DIR, &FILES, 1e-4, 5e-3);
}

/// The GGUF's `gemma4` vocabulary (SentencePiece-style BPE over newline runs, the file's
/// merges, `<0xXX>` byte fallback, BOS always) encodes as the HF directory's tokenizer.json
/// does: the perplexity text (spaces, newlines, punctuation, non-ASCII through byte tokens) and
/// a chat with the turn markers; BOS first with special tokens; decoding gives the text back.
#[test]
fn gguf_gemma4_vocabulary_encodes_as_the_hf_tokenizer() {
    let hf = file("hf").tokenizer().unwrap();
    let text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("assets/text/alice-ch1-9.txt"),
    )
    .unwrap();
    let text = &text[..text.char_indices().nth(6000).unwrap().0];
    let chat = "<|turn>user\nWho are you?  Ça va?\n\n\n<turn|>\n<|turn>model\n";
    for rel in ["tiny-gemma4-f32.gguf", "tiny-gemma4-q8_0.gguf"] {
        let gguf = file(rel).tokenizer().unwrap();
        assert!(gguf.add_bos() && hf.add_bos(), "{rel}: BOS first");
        for s in [text, chat] {
            let want = hf.encode(s, true).unwrap();
            assert_eq!(want[0], 261, "<bos>");
            assert_eq!(gguf.encode(s, true).unwrap(), want, "{rel}");
            assert_eq!(gguf.decode(&want[1..], false).unwrap(), s, "{rel}: round trip");
        }
    }
}

/// The fixture's `config.json` with `edit` applied, parsed.
fn parse_edited(
    edit: impl FnOnce(&mut serde_json::Value),
) -> Result<kvrun::loader::ModelConfig, String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(DIR).join("hf/config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    edit(&mut v);
    kvrun::loader::ModelConfig::from_hf_config_json(&v.to_string()).map_err(|e| e.to_string())
}

/// Configs as Google writes them and as they go wrong: `global_head_dim` and
/// `num_global_key_value_heads` instead of `per_layer_config` (the latter only with K = V, as
/// `Gemma4TextConfig` reads it), the text model of `Gemma4ForConditionalGeneration`; per-layer
/// embeddings, KV sharing, MoE blocks and bidirectional attention refused by name, a
/// `per_layer_config` that reshapes a sliding layer or gives the global layers two shapes
/// refused as broken.
#[test]
fn gemma4_configs_google_style_and_refused() {
    use serde_json::json;
    let c = parse_edited(|v| {
        let o = v.as_object_mut().unwrap();
        o.remove("per_layer_config");
        o.insert("global_head_dim".into(), json!(64));
        o.insert("num_global_key_value_heads".into(), json!(1));
    })
    .unwrap();
    let global = GlobalLayers { num_kv_heads: 1, head_dim: 64, values_from_keys: true };
    assert_eq!(c.global_layers, Some(global));
    let c = parse_edited(|v| {
        let o = v.as_object_mut().unwrap();
        o.remove("per_layer_config");
        o.insert("attention_k_eq_v".into(), json!(false));
        o.insert("num_global_key_value_heads".into(), json!(1));
    })
    .unwrap();
    // no K = V: the global layers keep the sliding KV heads, at the default 512 channels
    let global = GlobalLayers { num_kv_heads: 4, head_dim: 512, values_from_keys: false };
    assert_eq!(c.global_layers, Some(global));
    let flat = parse_edited(|_| {}).unwrap();
    let wrapped = parse_edited(|v| {
        let text = v.clone();
        *v = json!({"architectures": ["Gemma4ForConditionalGeneration"], "text_config": text,
                    "vision_config": {"hidden_size": 8}});
    })
    .unwrap();
    assert_eq!(wrapped, flat);
    let refused = [
        ("hidden_size_per_layer_input", json!(256), "per-layer embeddings"),
        ("num_kv_shared_layers", json!(2), "KV sharing"),
        ("enable_moe_block", json!(true), "mixture-of-experts"),
        ("use_bidirectional_attention", json!("all"), "bidirectional"),
        ("per_layer_config", json!({"1": {"head_dim": 64}}), "a sliding layer"),
        (
            "per_layer_config",
            json!({"2": {"head_dim": 64}, "5": {"head_dim": 128}}),
            "different head shapes",
        ),
        ("per_layer_config", json!({"9": {"head_dim": 64}}), "layer '9'"),
    ];
    for (key, value, says) in refused {
        let err = parse_edited(|v| {
            v[key] = value.clone();
        })
        .unwrap_err();
        assert!(err.contains(says), "{key} = {value}: {err}");
    }
}
