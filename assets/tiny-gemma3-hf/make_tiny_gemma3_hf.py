#!/usr/bin/env python3
"""Writes kvrun's tiny random Gemma 3 as an HF directory and its references, with HF
transformers' own modeling code (modeling_gemma3.py) as the independent forward and llama.cpp's
converter for the GGUFs.

    /path/to/venv/bin/python assets/tiny-gemma3-hf/make_tiny_gemma3_hf.py
    (torch on CPU, transformers 5.2x, numpy, gguf, safetensors, tokenizers; LLAMA_CPP: see
    ../hf-reference/tiny_hf.py)

Deterministic (seeded). Writes, next to this script:
  hf/                   Gemma3ForCausalLM.save_pretrained (f32): 6 layers (5 sliding with window
                        11, RoPE base 10k; 1 global, base 1e6), 4 query / 1 KV head, head_dim 32,
                        query_pre_attn_scalar 32, tied embeddings; every norm weight (HF stores
                        w and computes x · (1 + w)) drawn in [-0.7, 0.7], so the 1 + w offset,
                        the Q/K norms and the post-norms all move the logits
  tiny-gemma3-hf-f32.gguf   convert_hf_to_gguf.py hf/ --outtype f32 (GGUF arch gemma3; the
                        converter adds the 1 into the norm weights)
  tiny-gemma3-hf-q8_0.gguf  the same, --outtype q8_0
  golden.json           40 token ids and logits [40, 257] of transformers' forward in float64:
                        "hf_f32", and "gguf_q8_0" (the Q8_0 GGUF's weights, dequantized by gguf-py,
                        norms less the converter's 1, loaded back into the same model); and
                        "perplexity": of assets/text/alice-ch1-9.txt (128-token chunks, 4 of
                        them, llama-perplexity's convention) under both transformers forwards
                        and llama.cpp's llama-perplexity on both GGUFs
  golden-partial-rope.json
                        partial RoPE (the first 16 of each head's 32 channels, NEOX pairs within
                        them, frequencies base^(-2i/16)) on the same weights: the 40 ids' logits
                        "hf_f32" and the perplexity of transformers' float64 forward with
                        Qwen3-Next's apply_rotary_pos_emb (transformers' own partial-rotary code)
                        and partial_rotary_factor 0.5's frequencies, and llama.cpp's
                        llama-perplexity on tiny-gemma3-hf-f32.gguf with
                        gemma3.rope.dimension_count = 16 added by gguf-py (not committed: the
                        test writes the same file)
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf-reference"))
import tiny_hf  # noqa: E402

SEED = 3004
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] + '<end_of_turn>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

# GGUF base names of a layer's tensors (llama.cpp's) → HF module paths.
LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm", "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def make_model(vocab):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    config = Gemma3TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=1, head_dim=32, max_position_embeddings=256,
        sliding_window=11, query_pre_attn_scalar=32, rms_norm_eps=1e-6, initializer_range=0.1,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = Gemma3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.empty_like(p).uniform_(-0.7, 0.7))
    return model.float()


ROTARY_DIMS = 16


def make_partial_model(vocab):
    """make_model's weights, RoPE on the first ROTARY_DIMS channels of each head only.
    transformers' Gemma 3 rotates whole heads whatever its config says, so this swaps in the
    partial-rotary application of Qwen3-Next (rotates cos.shape[-1] channels, passes the rest)
    and the frequencies `_compute_default_rope_parameters` gives partial_rotary_factor 0.5."""
    import transformers.models.gemma3.modeling_gemma3 as gemma3
    import transformers.models.qwen3_next.modeling_qwen3_next as qwen3_next
    gemma3.apply_rotary_pos_emb = qwen3_next.apply_rotary_pos_emb
    model = make_model(vocab)
    rotary = model.model.rotary_emb
    for layer_type in rotary.layer_types:
        params = model.config.rope_parameters[layer_type]
        assert params["rope_type"] == "default", params
        base = params["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, ROTARY_DIMS, 2, dtype=torch.float)
                                   / ROTARY_DIMS))
        setattr(rotary, f"{layer_type}_inv_freq", inv_freq)
        setattr(rotary, f"{layer_type}_original_inv_freq", inv_freq.clone())
    return model


def partial_rope(vocab):
    """golden-partial-rope.json (see the module's docstring)."""
    import tempfile
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    ids = tiny_hf.read_golden(os.path.join(HERE, "golden.json"))["token_ids"]
    name = "tiny-gemma3-hf-f32.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, name)
        writer = gguf.GGUFWriter(path, "gemma3")
        key = MetadataDetails(gguf.GGUFValueType.UINT32, ROTARY_DIMS)
        copy_with_new_metadata(gguf.GGUFReader(os.path.join(HERE, name)), writer,
                               {"gemma3.rope.dimension_count": key}, [])
        llama = tiny_hf.llama_perplexity(path)
    text = tiny_hf.text_ids(os.path.join(HERE, "hf"))
    ppl = {
        "text": "assets/text/alice-ch1-9.txt", "ctx": tiny_hf.PPL_CTX,
        "chunks": tiny_hf.PPL_CHUNKS, "rotary_dims": ROTARY_DIMS,
        "transformers_f64": {"hf_f32": tiny_hf.perplexity_f64(make_partial_model(vocab), text)},
        "llama_cpp": {name: llama},
    }
    logits = {"hf_f32": tiny_hf.logits_f64(make_partial_model(vocab), ids)}
    tiny_hf.write_golden(os.path.join(HERE, "golden-partial-rope.json"), ids, logits,
                         {"perplexity": ppl})
    print("wrote golden-partial-rope.json:", ppl)


def main():
    vocab = tiny_hf.build(HERE, "tiny-gemma3-hf", SEED, make_model, CHAT_TEMPLATE, LAYER,
                          "gpt-2", norm_shift=1.0)
    partial_rope(vocab)


if __name__ == "__main__":
    main()
