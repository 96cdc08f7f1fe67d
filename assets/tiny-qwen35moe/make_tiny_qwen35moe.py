#!/usr/bin/env python3
"""Writes kvrun's tiny random Qwen3.5-MoE (hybrid: Gated DeltaNet + gated full attention, a
mixture of experts with a sigmoid-gated shared expert in every layer) and its references, with
HF transformers' own modeling code (modeling_qwen3_5_moe.py) as the independent forward and
llama.cpp's converter for the GGUFs.

    /path/to/venv/bin/python assets/tiny-qwen35moe/make_tiny_qwen35moe.py
    (torch on CPU, transformers 5.2x, numpy, gguf, safetensors, tokenizers; LLAMA_CPP: see
    ../hf-reference/tiny_hf.py)

Deterministic (seeded torch and numpy). Writes, next to this script:
  hf/                      Qwen3_5MoeForCausalLM.save_pretrained (f32 safetensors) and a
                           byte-level tokenizer: the tiny Qwen3.5's layers
                           (../tiny-qwen35/make_tiny_qwen35.py: 3 DeltaNet, 1 gated attention)
                           with every MLP a mixture of 16 experts of 32 channels, 4 a token
                           (renormalised), and a shared expert of 64 channels gated by
                           sigmoid(x · shared_expert_gate); router weights drawn wide
  tiny-qwen35moe-f32.gguf  convert_hf_to_gguf.py hf/ --outtype f32 --no-mtp (GGUF qwen35moe)
  tiny-qwen35moe-q8_0.gguf convert_hf_to_gguf.py hf/ --outtype q8_0 --no-mtp
  golden.json              40 token ids and logits [40, 258] (258: the tokenizer transformers
                           loads for this model type adds <|endoftext|>) of transformers' forward in float64
                           for hf/ and for the Q8_0 GGUF's dequantized weights (the converter's
                           changes undone as ../tiny-qwen35 undoes them), and the perplexity of
                           assets/text/alice-ch1-9.txt under both and llama.cpp's
                           llama-perplexity on both GGUFs
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf-reference"))
sys.path.insert(0, os.path.join(HERE, "..", "tiny-qwen35"))
import make_tiny_qwen35 as dense  # noqa: E402
import tiny_hf  # noqa: E402

SEED = 4305
LAYERS = 4
CHAT_TEMPLATE = dense.CHAT_TEMPLATE


def make_model(vocab):
    from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig
    config = Qwen3_5MoeTextConfig(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4,
        num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                         "mrope_interleaved": True},
        initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    config._attn_implementation = "eager"
    # the per-expert loop (the grouped_mm default has no float64)
    config._experts_implementation = "eager"
    torch.manual_seed(SEED)
    model = Qwen3_5MoeForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(torch.empty_like(p).uniform_(0.3, 1.7))
            elif name.endswith("norm.weight"):
                p.copy_(torch.empty_like(p).uniform_(-0.7, 0.7))
            elif name.endswith("dt_bias"):
                p.copy_(torch.empty_like(p).uniform_(-1.0, 1.0))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(-1.0, 1.5))
            elif name.endswith("mlp.gate.weight"):
                p.copy_(torch.empty_like(p).normal_(0.0, 1.0))
            elif "expert" in name:
                p.copy_(torch.empty_like(p).normal_(0.0, 0.2))
    return model.float()


# the MoE tensors' GGUF base names (llama.cpp's qwen35moe) → HF module paths
dense.LAYER.update({
    "ffn_gate_inp": "mlp.gate", "ffn_gate_inp_shexp": "mlp.shared_expert_gate",
    "ffn_gate_shexp": "mlp.shared_expert.gate_proj", "ffn_up_shexp": "mlp.shared_expert.up_proj",
    "ffn_down_shexp": "mlp.shared_expert.down_proj",
})


def gguf_state(path, config):
    """The GGUF's tensors as transformers' state dict: ../tiny-qwen35's undoing for the
    layers, the stacked experts' gate and up back into gate_up_proj, the shared expert's gate
    vector [hidden] back into its [1, hidden] linear."""
    arrays = tiny_hf.gguf_arrays(path)
    experts = {k: arrays.pop(k) for k in list(arrays) if "_exps." in k}
    read = tiny_hf.gguf_arrays
    tiny_hf.gguf_arrays = lambda _: arrays  # the dense undoing over the rest
    try:
        state = dense.gguf_state(path, config)
    finally:
        tiny_hf.gguf_arrays = read
    for k in list(state):
        if k.endswith("shared_expert_gate.weight"):
            state[k] = state[k].reshape(1, -1)
    for layer in range(LAYERS):
        g = experts[f"blk.{layer}.ffn_gate_exps.weight"]
        u = experts[f"blk.{layer}.ffn_up_exps.weight"]
        prefix = f"model.layers.{layer}.mlp.experts"
        state[f"{prefix}.gate_up_proj"] = torch.from_numpy(np.concatenate([g, u], axis=1))
        state[f"{prefix}.down_proj"] = torch.from_numpy(
            np.ascontiguousarray(experts[f"blk.{layer}.ffn_down_exps.weight"]))
    return state


def main():
    # transformers loads this model type's tokenizer as Qwen3_5Tokenizer, which adds
    # <|endoftext|> (id 257) to the byte-level vocabulary; the converter wants it inside the
    # embedding
    dense.build(HERE, "tiny-qwen35moe", SEED, make_model, gguf_state, vocab_extra=1)


if __name__ == "__main__":
    main()
