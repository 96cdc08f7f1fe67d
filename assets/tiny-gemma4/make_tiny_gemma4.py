#!/usr/bin/env python3
"""Writes kvrun's tiny random Gemma 4 (dense, text only) as an HF directory and its references,
with HF transformers' own modeling code (modeling_gemma4.py) as the independent forward and
llama.cpp's converter for the GGUFs.

    /path/to/venv/bin/python assets/tiny-gemma4/make_tiny_gemma4.py
    (torch on CPU, transformers 5.2x with models.gemma4, numpy, gguf, safetensors, tokenizers;
    LLAMA_CPP: see ../hf-reference/tiny_hf.py)

Deterministic (seeded torch and numpy). Writes, next to this script:
  hf/                   Gemma4ForCausalLM.save_pretrained (f32 safetensors, config.json) and a
                        Gemma-style tokenizer (see write_tokenizer): hidden 64, FFN 128
                        (GELU-tanh gate), 6 layers sliding, sliding, full, sliding, sliding, full;
                        sliding layers: 4 query / 4 KV heads of 32, window 11, RoPE base 1e4 on
                        whole heads; full layers: 4 query heads / 1 KV head of 64
                        (global_head_dim: half a sliding layer's KV a token, as 4 × 512 beside
                        16 × 256 in a 31B: kvrun packs the two into one pool slot), attention_k_eq_v (no v_proj: V is K's projection
                        before k_norm and RoPE, through the weightless v_norm), "proportional"
                        RoPE base 1e6 on the first 8 of each head's 32 rotation pairs
                        (frequencies base^(-2i/64)); Q/K norms, attention scale 1, sandwich
                        norms, per-layer layer_scalar, final logit softcap 5, tied embeddings
                        scaled by sqrt(64); no per-layer embeddings, no KV sharing, no MoE.
                        Every norm weight (Gemma 4 computes x · w, no 1 +) drawn in [0.3, 1.7]
                        (the Q/K norms' in [0.3, 1.0]: with attention scale 1 larger ones make
                        the softmax so sharp that f16 K/V rounding alone moves logits by
                        several 1e-2), every layer_scalar (a persistent buffer: in the
                        safetensors) in [0.5, 1.5]
  tiny-gemma4-f32.gguf  convert_hf_to_gguf.py hf/ --outtype f32 (GGUF arch gemma4; the weights
                        as they are: no norm shift; layer_scalar → blk.N.layer_output_scale;
                        a rope_freqs tensor [1] * 8 + [1e30] * 24 for the full layers'
                        proportional RoPE; tokenizer.ggml.model "gemma4")
  tiny-gemma4-q8_0.gguf the same, --outtype q8_0
  golden.json           40 token ids (<bos> and 39 tokens of assets/text/alice-ch1-9.txt
                        from "Alice was beginning" on) and logits [40, 264] of transformers'
                        forward in float64: "hf_f32" (hf/), "gguf_q8_0" (the Q8_0 GGUF's weights
                        as gguf-py dequantizes them loaded back into the same model); and
                        "perplexity": of assets/text/alice-ch1-9.txt (128-token chunks, 4 of
                        them; llama-perplexity's convention where BOS is added, as llama.cpp
                        always does for Gemma 4: <bos> + the text's tokens, each chunk's first
                        token replaced by <bos>) under both
                        transformers forwards and llama.cpp's llama-perplexity on both GGUFs
  golden-long.json      120 token ids (<bos> and 119 of the text from the same place: many
                        sliding windows) and their logits "hf_f32" [120, 264]

The tokenizer: llama.cpp's Gemma 4 converter reads tokenizer.json as a Llama-style BPE with
byte fallback (gguf.LlamaHfVocab: model BPE with byte_fallback, a Sequence decoder) and llama.cpp
tokenizes it as Gemma 4 does: spaces → "▁", BPE merges on raw UTF-8, bytes outside the
vocabulary as <0xXX> tokens. So: ids 0-255 the byte tokens <0x00>…<0xFF>, 256 "▁", 257 "t",
258 "▁t" (the one merge: llama.cpp wants merges), then the specials <pad> 259, <eos> 260,
<bos> 261, <|turn> 262, <turn|> 263 (Gemma 4's turn markers, for the chat template).
"""
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf-reference"))
import tiny_hf  # noqa: E402

SEED = 4004
NAME = "tiny-gemma4"
N_LONG = 120
GOLDEN_FROM = "Alice was beginning"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|turn>' + message['role'] + '\n' + message['content'] + '<turn|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|turn>model\n' }}{% endif %}"
)
SPECIALS = ["<pad>", "<eos>", "<bos>", "<|turn>", "<turn|>"]
PAD, EOS, BOS = 259, 260, 261


def write_tokenizer(out):
    """tokenizer.json and tokenizer_config.json (see the module's docstring); returns the
    vocabulary size."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    vocab = {f"<0x{b:02X}>": b for b in range(256)}
    vocab.update({"▁": 256, "t": 257, "▁t": 258})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("▁", "t")], byte_fallback=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()])
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in SPECIALS])
    # BOS first, as Gemma's own tokenizer.json adds it (llama.cpp always adds it for Gemma 4)
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", BOS)])
    tok.save(os.path.join(out, "tokenizer.json"))
    assert [tok.token_to_id(s) for s in SPECIALS[:3]] == [PAD, EOS, BOS]
    config = {"chat_template": CHAT_TEMPLATE, "bos_token": "<bos>", "eos_token": "<eos>",
              "pad_token": "<pad>", "extra_special_tokens": SPECIALS[3:],
              "model_max_length": 256,
              "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return len(vocab) + len(SPECIALS)


def make_model(vocab):
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig
    config = Gemma4TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
        sliding_window=11, num_attention_heads=4, num_key_value_heads=4, head_dim=32,
        global_head_dim=64, num_global_key_value_heads=1, attention_k_eq_v=True,
        hidden_size_per_layer_input=0, vocab_size_per_layer_input=vocab,
        num_kv_shared_layers=0, enable_moe_block=False, use_double_wide_mlp=False,
        final_logit_softcapping=5.0,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1_000_000.0},
        },
        max_position_embeddings=256, tie_word_embeddings=True, rms_norm_eps=1e-6,
        initializer_range=0.1, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = Gemma4ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                # attention scale 1: Q/K norm weights up to 1.7 make scores of spread ~10, a
                # softmax so sharp that f16 K/V rounding moves the 120-token logits by 0.04
                p.copy_(torch.empty_like(p).uniform_(0.3, 1.0))
            elif name.endswith("norm.weight"):
                # Gemma 4's norms multiply by w (no 1 +): far from 1
                p.copy_(torch.empty_like(p).uniform_(0.3, 1.7))
        # one distinct scalar per layer in [0.5, 1.5]
        scalars = np.random.default_rng(SEED).permutation(config.num_hidden_layers)
        for layer, s in zip(model.model.layers, scalars):
            layer.layer_scalar.fill_(0.5 + (s + torch.rand(()).item()) / config.num_hidden_layers)
    return model.float()


# GGUF base names of a layer's tensors (llama.cpp's gemma4) → HF module paths.
LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def gguf_state(path):
    """The GGUF's tensors as transformers' state dict (the converter changes no weight; its
    rope_freqs, made from the config, has no counterpart)."""
    state = {}
    for name, a in tiny_hf.gguf_arrays(path).items():
        if name == "rope_freqs.weight":
            continue
        if name.endswith(".layer_output_scale.weight"):
            hf = f"model.layers.{name.split('.')[1]}.layer_scalar"
        else:
            hf = tiny_hf.hf_name(name, LAYER)
        state[hf] = torch.from_numpy(np.ascontiguousarray(a))
    return state


def tokenizer_ids(hf, text):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(hf, "tokenizer.json"))
    return tok.encode(text, add_special_tokens=False).ids


def perplexity_bos_f64(model, text):
    """tiny_hf.perplexity_f64 as llama-perplexity (and kvrun's perplexity) count it where the
    vocabulary adds BOS (llama.cpp always does for Gemma 4): the text tokenized with <bos> in
    front, then each chunk's first token replaced by <bos>."""
    ids = [BOS] + list(text)
    for c in range(tiny_hf.PPL_CHUNKS):
        ids[c * tiny_hf.PPL_CTX] = BOS
    return tiny_hf.perplexity_f64(model, ids)


def main():
    hf = os.path.join(HERE, "hf")
    os.makedirs(hf, exist_ok=True)
    vocab = write_tokenizer(hf)
    make_model(vocab).save_pretrained(hf, safe_serialization=True)
    text = tiny_hf.text_ids(hf)
    # the golden prompts: <bos> and the text from its first sentence on (its title is mostly
    # indentation, runs of "▁"); a whole-text ids' slice, as no merge crosses "A"
    with open(tiny_hf.PPL_TEXT, encoding="utf-8") as f:
        start = len(tokenizer_ids(hf, f.read().split(GOLDEN_FROM)[0]))
    ids = [BOS] + text[start:start + tiny_hf.N_GOLDEN_TOKENS - 1]
    long_ids = [BOS] + text[start:start + N_LONG - 1]
    f32 = os.path.join(HERE, f"{NAME}-f32.gguf")
    q8 = os.path.join(HERE, f"{NAME}-q8_0.gguf")
    tiny_hf.convert(hf, f32, "f32", "gemma4")
    tiny_hf.convert(hf, q8, "q8_0", "gemma4")
    # the f32 GGUF read back must be hf/ exactly: the mapping below is then right
    ref = make_model(vocab).to(torch.float64)
    f32_state = gguf_state(f32)
    for k, v in ref.state_dict().items():
        if k == "lm_head.weight":
            continue
        assert k in f32_state, k
        assert torch.equal(v, f32_state[k].to(v.dtype)), k
    q_model = make_model(vocab).to(torch.float64)
    missing, unexpected = q_model.load_state_dict(gguf_state(q8), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    q_model.tie_weights()
    logits = {"hf_f32": tiny_hf.logits_f64(make_model(vocab), ids),
              "gguf_q8_0": tiny_hf.logits_f64(q_model, ids)}
    ppl = {
        "text": "assets/text/alice-ch1-9.txt", "ctx": tiny_hf.PPL_CTX,
        "chunks": tiny_hf.PPL_CHUNKS, "bos": BOS,
        "transformers_f64": {"hf_f32": perplexity_bos_f64(make_model(vocab), text),
                             "gguf_q8_0": perplexity_bos_f64(q_model, text)},
        "llama_cpp": {os.path.basename(f): tiny_hf.llama_perplexity(f) for f in (f32, q8)},
    }
    tiny_hf.write_golden(os.path.join(HERE, "golden.json"), ids, logits, {"perplexity": ppl})
    tiny_hf.write_golden(os.path.join(HERE, "golden-long.json"), long_ids,
                         {"hf_f32": tiny_hf.logits_f64(make_model(vocab), long_ids)})
    print("wrote", hf, f32, q8, "golden.json golden-long.json", ppl)


if __name__ == "__main__":
    main()
