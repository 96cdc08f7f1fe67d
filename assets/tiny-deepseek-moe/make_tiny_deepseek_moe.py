#!/usr/bin/env python3
"""Writes kvrun's tiny random DeepSeek-V2 with mixture-of-experts layers and its references, with
HF transformers' own modeling code (modeling_deepseek_v2.py) as the independent forward and
llama.cpp's converter for the GGUFs.

    /path/to/venv/bin/python assets/tiny-deepseek-moe/make_tiny_deepseek_moe.py
    (torch on CPU, transformers 5.2x, numpy, gguf, safetensors, tokenizers; LLAMA_CPP: see
    ../hf-reference/tiny_hf.py)

Deterministic (seeded torch and numpy). Writes, next to this script:
  hf/                       DeepseekV2ForCausalLM.save_pretrained (f32 safetensors, one tensor
                            per expert) and a byte-level tokenizer: 3 layers, the first dense
                            (first_k_dense_replace 1), then mixtures of 16 experts of 32
                            channels in 4 groups, 4 experts a token from the best 2 groups
                            (group_limited_greedy), routed scaling factor 2, 2 shared experts;
                            MLA with q_lora_rank 32, kv_lora_rank 96, qk_nope 32 + qk_rope 32,
                            v_head_dim 32; router weights drawn wide so no two experts' (or
                            groups') probabilities nearly tie; norm weights far from 1
  tiny-deepseek-moe-f32.gguf  convert_hf_to_gguf.py hf/ --outtype f32 (GGUF arch deepseek2,
                            stacked ffn_*_exps, ffn_*_shexp, kv_b split into attn_k_b/attn_v_b)
  tiny-deepseek-moe-q8_0.gguf convert_hf_to_gguf.py hf/ --outtype q8_0
  golden.json               40 token ids and logits [40, 257] of transformers' forward in
                            float64 for hf/ and for the Q8_0 GGUF's dequantized weights, their
                            perplexity of assets/text/alice-ch1-9.txt and llama.cpp's
                            llama-perplexity on both GGUFs (../hf-reference/tiny_hf.py); under
                            "f16_kv" the same two forwards with the MLA latent (the cache's row:
                            the normed c_kv and the RoPE'd k_pe) rounded to f16, as kvrun's
                            default KV cache stores it
"""
import contextlib
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf-reference"))
import tiny_hf  # noqa: E402

SEED = 4304
LAYERS, HEADS, NOPE, ROPE, V_DIM, RANK = 3, 4, 32, 32, 32, 96
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# GGUF base names of a layer's tensors that map one to one (llama.cpp's) → HF module paths.
LAYER = {
    "attn_norm": "input_layernorm", "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm", "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa", "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_output": "self_attn.o_proj", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate", "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj", "ffn_down_shexp": "mlp.shared_experts.down_proj",
}


def make_model(vocab):
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM
    config = DeepseekV2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=HEADS,
        n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=2,
        first_k_dense_replace=1, n_group=4, topk_group=2, topk_method="group_limited_greedy",
        routed_scaling_factor=2.0, norm_topk_prob=False, q_lora_rank=32, kv_lora_rank=RANK,
        qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=V_DIM,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        initializer_range=0.1, bos_token_id=None, eos_token_id=None,
    )
    config._attn_implementation = "eager"
    # the per-expert loop (the grouped_mm default has no float64)
    config._experts_implementation = "eager"
    torch.manual_seed(SEED)
    model = DeepseekV2ForCausalLM(config)
    init_weights(model)
    return model.float()


def init_weights(model):
    """Norm weights far from 1, router weights wide (no near-ties between experts or groups),
    experts N(0, 0.2); drawn in parameter order from torch's seeded generator."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(torch.empty_like(p).uniform_(0.3, 1.7))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.empty_like(p).normal_(0.0, 1.0))
            elif "experts" in name:
                p.copy_(torch.empty_like(p).normal_(0.0, 0.2))


def gguf_state(arrays):
    """The Q8_0 GGUF's dequantized tensors as DeepseekV2ForCausalLM's parameters: stacked
    experts' gate and up back into gate_up_proj, and kv_b_proj from the converter's per-head
    attn_k_b [heads, rank, nope] (transposed) and attn_v_b [heads, v, rank]."""
    state = {}
    for k, v in arrays.items():
        if "_exps." in k or ".attn_k_b." in k or ".attn_v_b." in k:
            continue
        state[tiny_hf.hf_name(k, LAYER)] = v
    for layer in range(LAYERS):
        k_b = arrays[f"blk.{layer}.attn_k_b.weight"]
        v_b = arrays[f"blk.{layer}.attn_v_b.weight"]
        kv_b = np.concatenate([k_b.transpose(0, 2, 1), v_b], axis=1)
        state[f"model.layers.{layer}.self_attn.kv_b_proj.weight"] = kv_b.reshape(-1, RANK)
        if f"blk.{layer}.ffn_gate_exps.weight" not in arrays:
            continue
        g = arrays[f"blk.{layer}.ffn_gate_exps.weight"]
        u = arrays[f"blk.{layer}.ffn_up_exps.weight"]
        prefix = f"model.layers.{layer}.mlp.experts"
        state[f"{prefix}.gate_up_proj"] = np.concatenate([g, u], axis=1)
        state[f"{prefix}.down_proj"] = arrays[f"blk.{layer}.ffn_down_exps.weight"]
    return state


@contextlib.contextmanager
def f16_latent_of(module, norm_cls, rotary_name):
    """What kvrun's f16 cache holds of MLA rounded to f16: the normed latent c_kv (the output
    of `norm_cls` RANK wide) and the RoPE'd shared key k_pe (the second output of the
    function `rotary_name` of the modeling `module`)."""
    layernorm_forward = norm_cls.forward
    rotary = getattr(module, rotary_name)

    def latent_norm(self, x):
        out = layernorm_forward(self, x)
        return out.half().to(out.dtype) if self.weight.shape[0] == RANK else out

    def rounded_rotary(*args, **kwargs):
        q, k = rotary(*args, **kwargs)
        return q, k.half().to(k.dtype)

    norm_cls.forward = latent_norm
    setattr(module, rotary_name, rounded_rotary)
    try:
        yield
    finally:
        norm_cls.forward = layernorm_forward
        setattr(module, rotary_name, rotary)


def f16_latent():
    """f16_latent_of DeepSeek-V2's modeling."""
    import transformers.models.deepseek_v2.modeling_deepseek_v2 as d
    return f16_latent_of(d, d.DeepseekV2RMSNorm, "apply_rotary_emb")


def main():
    tiny_hf.build(HERE, "tiny-deepseek-moe", SEED, make_model, CHAT_TEMPLATE, LAYER, "qwen2",
                  gguf_state=gguf_state)
    tiny_hf.add_f16_kv_references(HERE, "tiny-deepseek-moe", make_model, gguf_state, f16_latent)


if __name__ == "__main__":
    main()
