#!/usr/bin/env python3
"""Writes kvrun's tiny random DeepSeek-V3 (DeepSeek-V2's MLA with V3's router) and its
references, with HF transformers' own modeling code (modeling_deepseek_v3.py) as the independent
forward and llama.cpp's converter for the GGUFs.

    /path/to/venv/bin/python assets/tiny-deepseek-v3/make_tiny_deepseek_v3.py
    (torch on CPU, transformers 5.2x, numpy, gguf, safetensors, tokenizers; LLAMA_CPP: see
    ../hf-reference/tiny_hf.py)

Deterministic (seeded torch and numpy). Writes, next to this script:
  hf/                       DeepseekV3ForCausalLM.save_pretrained (f32 safetensors, one tensor
                            per expert; config.json with scoring_func and topk_method) and a
                            byte-level tokenizer: 3 layers, the first dense
                            (first_k_dense_replace 1), then mixtures of 16 experts of 32 channels
                            routed as V3 does (noaux_tc): sigmoid scores, a per-expert bias
                            (e_score_correction_bias, drawn N(0, 0.3) so it changes choices)
                            added for the choice only, 4 groups ranked by the sum of their two
                            best biased scores, the best 2 kept, 4 experts a token, their
                            unbiased scores renormalised and times the routed scaling factor
                            2.5; one shared expert; the MLA of ../tiny-deepseek-moe
  tiny-deepseek-v3-f32.gguf  convert_hf_to_gguf.py hf/ --outtype f32 (GGUF arch deepseek2,
                            expert_gating_func 2 = sigmoid, exp_probs_b.bias)
  tiny-deepseek-v3-q8_0.gguf convert_hf_to_gguf.py hf/ --outtype q8_0
  golden.json               as ../tiny-deepseek-moe's, "f16_kv" included
"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf-reference"))
sys.path.insert(0, os.path.join(HERE, "..", "tiny-deepseek-moe"))
import make_tiny_deepseek_moe as v2  # noqa: E402
import tiny_hf  # noqa: E402

SEED = 4305
BIAS = "exp_probs_b.bias"


def make_model(vocab):
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    config = DeepseekV3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
        num_hidden_layers=v2.LAYERS, num_attention_heads=v2.HEADS,
        num_key_value_heads=v2.HEADS, n_routed_experts=16, num_experts_per_tok=4,
        n_shared_experts=1, first_k_dense_replace=1, n_group=4, topk_group=2,
        routed_scaling_factor=2.5, norm_topk_prob=True, q_lora_rank=32, kv_lora_rank=v2.RANK,
        qk_rope_head_dim=v2.ROPE, qk_nope_head_dim=v2.NOPE, v_head_dim=v2.V_DIM,
        max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0},
        initializer_range=0.1, bos_token_id=None, eos_token_id=None,
        # as DeepSeek-V3's published config.json says (transformers' modeling has them built
        # in and writes neither; llama.cpp's converter reads scoring_func for
        # expert_gating_func, else its loader falls back to V2's softmax)
        scoring_func="sigmoid", topk_method="noaux_tc",
    )
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(SEED)
    model = DeepseekV3ForCausalLM(config)
    v2.init_weights(model)
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.empty_like(b).normal_(0.0, 0.3))
    return model.float()


def gguf_state(arrays):
    """The Q8_0 GGUF's tensors as DeepseekV3ForCausalLM's parameters: ../tiny-deepseek-moe's
    mapping, and exp_probs_b.bias back to the router's e_score_correction_bias."""
    biases = {k: v for k, v in arrays.items() if k.endswith(BIAS)}
    state = v2.gguf_state({k: v for k, v in arrays.items() if not k.endswith(BIAS)})
    for k, v in biases.items():
        layer = k.split(".")[1]
        state[f"model.layers.{layer}.mlp.gate.e_score_correction_bias"] = v
    return state


def f16_latent():
    """../tiny-deepseek-moe's f16 rounding of the MLA latent, on V3's module."""
    import transformers.models.deepseek_v3.modeling_deepseek_v3 as d
    return v2.f16_latent_of(d, d.DeepseekV3RMSNorm, "apply_rotary_pos_emb_interleave")


def main():
    tiny_hf.build(HERE, "tiny-deepseek-v3", SEED, make_model, v2.CHAT_TEMPLATE, v2.LAYER,
                  "qwen2", gguf_state=gguf_state)
    tiny_hf.add_f16_kv_references(HERE, "tiny-deepseek-v3", make_model, gguf_state, f16_latent)


if __name__ == "__main__":
    main()
