#!/usr/bin/env python3
"""Writes kvrun's tiny random Qwen3 and its references, with HF transformers' own modeling code
(modeling_qwen3.py) as the independent forward and llama.cpp's converter for the GGUFs.

    /path/to/venv/bin/python assets/tiny-qwen3/make_tiny_qwen3.py
    (torch on CPU, transformers 5.2x, numpy, gguf, safetensors, tokenizers; LLAMA_CPP: see
    ../hf-reference/tiny_hf.py)

Deterministic (seeded torch and numpy). Writes, next to this script:
  hf/                  Qwen3ForCausalLM.save_pretrained (f32 safetensors, config.json) and a
                       byte-level tokenizer: 2 layers, 4 query / 2 KV heads, head_dim 32
                       (explicit: 4 × 32 ≠ hidden 64, as Qwen3-0.6B's 16 × 128 ≠ 1024), tied
                       embeddings, RoPE base 1e6, Q/K norm weights drawn far from 1
  tiny-qwen3-f32.gguf  convert_hf_to_gguf.py hf/ --outtype f32 (GGUF arch qwen3)
  tiny-qwen3-q8_0.gguf convert_hf_to_gguf.py hf/ --outtype q8_0
  golden.json          40 token ids and logits [40, 257] of transformers' forward in float64:
                       "hf_f32" (hf/), "gguf_q8_0" (the Q8_0 GGUF's weights as gguf-py
                       dequantizes them, loaded back into the same transformers model); and
                       "perplexity": of assets/text/alice-ch1-9.txt (128-token chunks, 4 of them,
                       llama-perplexity's convention) under both transformers forwards and
                       llama.cpp's llama-perplexity on both GGUFs
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf-reference"))
import tiny_hf  # noqa: E402

SEED = 3003
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# GGUF base names of a layer's tensors (llama.cpp's) → HF module paths.
LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def make_model(vocab):
    from transformers import Qwen3Config, Qwen3ForCausalLM
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        initializer_range=0.1, bos_token_id=None, eos_token_id=None,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # far from 1, so a dropped or misplaced norm moves the logits
                p.copy_(torch.empty_like(p).uniform_(0.3, 1.7))
    return model.float()


def main():
    tiny_hf.build(HERE, "tiny-qwen3", SEED, make_model, CHAT_TEMPLATE, LAYER, "qwen2")


if __name__ == "__main__":
    main()
