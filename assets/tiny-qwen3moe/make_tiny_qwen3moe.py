#!/usr/bin/env python3
"""Writes kvrun's tiny random Qwen3-MoE and its references, with HF transformers' own modeling
code (modeling_qwen3_moe.py) as the independent forward and llama.cpp's converter for the GGUFs.

    /path/to/venv/bin/python assets/tiny-qwen3moe/make_tiny_qwen3moe.py
    (torch on CPU, transformers 5.2x, numpy, gguf, safetensors, tokenizers; LLAMA_CPP: see
    ../hf-reference/tiny_hf.py)

Deterministic (seeded torch and numpy). Writes, next to this script:
  hf/                     Qwen3MoeForCausalLM.save_pretrained (f32 safetensors: one tensor per
                          expert, as the published checkpoints) and a byte-level tokenizer:
                          2 layers, 4 query / 2 KV heads, head_dim 32, 16 experts of 32 channels
                          in every layer, 4 a token, norm_topk_prob (llama.cpp always
                          renormalises for qwen3moe), router weights drawn wide so the experts'
                          probabilities are far apart, Q/K norm weights far from 1
  tiny-qwen3moe-f32.gguf  convert_hf_to_gguf.py hf/ --outtype f32 (GGUF arch qwen3moe, stacked
                          ffn_{gate,up,down}_exps)
  tiny-qwen3moe-q8_0.gguf convert_hf_to_gguf.py hf/ --outtype q8_0
  golden.json             40 token ids and logits [40, 257] of transformers' forward in float64
                          for hf/ and for the Q8_0 GGUF's dequantized weights, and the
                          perplexity of assets/text/alice-ch1-9.txt under transformers and
                          llama.cpp's llama-perplexity (../hf-reference/tiny_hf.py); under
                          "f16_kv" the same two forwards' logits and perplexity with keys and
                          values rounded to f16, as kvrun's default KV cache stores them
"""
import contextlib
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf-reference"))
import tiny_hf  # noqa: E402

SEED = 4303
EXPERTS, USED, EXPERT_FFN, LAYERS = 16, 4, 32, 2
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# GGUF base names of a layer's non-expert tensors (llama.cpp's) → HF module paths.
LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm", "ffn_gate_inp": "mlp.gate",
}


def make_model(vocab):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    config = Qwen3MoeConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
        num_experts=EXPERTS, num_experts_per_tok=USED, moe_intermediate_size=EXPERT_FFN,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        initializer_range=0.1, bos_token_id=None, eos_token_id=None,
    )
    config._attn_implementation = "eager"
    # the per-expert loop of modeling_qwen3_moe.py (the grouped_mm default has no float64)
    config._experts_implementation = "eager"
    torch.manual_seed(SEED)
    model = Qwen3MoeForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # far from 1, so a dropped or misplaced norm moves the logits
                p.copy_(torch.empty_like(p).uniform_(0.3, 1.7))
            elif name.endswith("mlp.gate.weight"):
                # wide router logits: no two experts' probabilities nearly tie, so an f32
                # forward routes each token as the float64 one does
                p.copy_(torch.empty_like(p).normal_(0.0, 1.0))
            elif "experts" in name:
                p.copy_(torch.empty_like(p).normal_(0.0, 0.2))
    return model.float()


def gguf_state(arrays):
    """The Q8_0 GGUF's dequantized tensors as Qwen3MoeForCausalLM's parameters: stacked
    experts' gate and up back into gate_up_proj [experts, 2 · ffn, hidden]."""
    state = {}
    for k, v in arrays.items():
        if "_exps." in k:
            continue
        state[tiny_hf.hf_name(k, LAYER)] = v
    for layer in range(LAYERS):
        g = arrays[f"blk.{layer}.ffn_gate_exps.weight"]
        u = arrays[f"blk.{layer}.ffn_up_exps.weight"]
        prefix = f"model.layers.{layer}.mlp.experts"
        state[f"{prefix}.gate_up_proj"] = np.concatenate([g, u], axis=1)
        state[f"{prefix}.down_proj"] = arrays[f"blk.{layer}.ffn_down_exps.weight"]
    return state


@contextlib.contextmanager
def f16_kv():
    """Every key and value rounded to f16 before attention, as kvrun's default KV cache stores
    them. This model's perplexity moves 1.4e-4 with that rounding (359.4152 → 359.3633), more
    than the f32 forwards' own error."""
    import transformers.models.qwen3_moe.modeling_qwen3_moe as q
    orig = q.eager_attention_forward

    def rounded(module, query, key, value, *args, **kwargs):
        return orig(module, query, key.half().to(key.dtype), value.half().to(value.dtype),
                    *args, **kwargs)

    q.ALL_ATTENTION_FUNCTIONS["eager"] = rounded
    try:
        yield
    finally:
        q.ALL_ATTENTION_FUNCTIONS["eager"] = orig


def main():
    tiny_hf.build(HERE, "tiny-qwen3moe", SEED, make_model, CHAT_TEMPLATE, LAYER, "qwen2",
                  gguf_state=gguf_state)
    tiny_hf.add_f16_kv_references(HERE, "tiny-qwen3moe", make_model, gguf_state, f16_kv)


if __name__ == "__main__":
    main()
