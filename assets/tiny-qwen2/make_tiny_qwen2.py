#!/usr/bin/env python3
"""Writes kvrun's tiny synthetic Qwen2 (HF safetensors) and the golden logits of its bias path.

    pip install numpy gguf safetensors tokenizers
    python3 assets/tiny-qwen2/make_tiny_qwen2.py

Deterministic (seeded). The shapes, tokenizer and float64 forward are the tiny Llama's
(assets/tiny-llama/make_tiny_llama.py, imported); Qwen2 differs by its q/k/v projection biases
(modeling_qwen2.py: `nn.Linear(..., bias=True)` for q_proj, k_proj, v_proj; o_proj without), which
the forward below adds before RoPE. Writes, next to this script:
  hf/config.json, hf/model.safetensors (f32), hf/tokenizer.json, hf/tokenizer_config.json
  golden.json   40 token ids and logits [40, 256] of the float64 numpy forward
"""
import json
import os
import sys

import numpy as np
from safetensors.numpy import save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tiny-llama"))
import make_tiny_llama as llama  # noqa: E402

SEED = 2024


def make_weights(rng):
    w = llama.make_weights(rng)
    for i in range(llama.N_LAYERS):
        for proj, n in (("q", llama.N_HEADS), ("k", llama.N_KV_HEADS), ("v", llama.N_KV_HEADS)):
            # Large enough that a dropped bias moves the logits far past the test's tolerance.
            w[f"model.layers.{i}.self_attn.{proj}_proj.bias"] = (
                rng.standard_normal(n * llama.HEAD_DIM) * 0.5).astype(np.float32)
    return w


def write_hf(w):
    out = os.path.join(HERE, "hf")
    os.makedirs(out, exist_ok=True)
    llama.OUT = HERE  # the tiny Llama's writer puts tokenizer files under OUT/hf
    llama.write_hf({k: v for k, v in w.items()})
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
        "hidden_size": llama.HIDDEN, "intermediate_size": llama.FFN,
        "num_hidden_layers": llama.N_LAYERS, "num_attention_heads": llama.N_HEADS,
        "num_key_value_heads": llama.N_KV_HEADS, "vocab_size": llama.VOCAB,
        "max_position_embeddings": llama.MAX_POS, "rms_norm_eps": llama.EPS,
        "rope_theta": llama.ROPE_THETA, "rope_scaling": None, "tie_word_embeddings": False,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": llama.N_LAYERS,
        "hidden_act": "silu", "torch_dtype": "float32",
    }
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    save_file(w, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})


def forward(w, ids):
    """The tiny Llama's forward with each layer's q/k/v biases added (Qwen2 semantics)."""
    t = llama.canonical_from_hf({k: v for k, v in w.items() if not k.endswith(".bias")})
    bias = {k: v.astype(np.float64) for k, v in w.items() if k.endswith(".bias")}
    positions = np.arange(len(ids))
    x = t["token_embd.weight"][ids]
    for i in range(llama.N_LAYERS):
        h = llama.rms_norm(x, t[f"blk.{i}.attn_norm.weight"])
        n = h.shape[0]
        pre = f"model.layers.{i}.self_attn"
        q = (h @ t[f"blk.{i}.attn_q.weight"].T + bias[f"{pre}.q_proj.bias"])
        k = (h @ t[f"blk.{i}.attn_k.weight"].T + bias[f"{pre}.k_proj.bias"])
        v = (h @ t[f"blk.{i}.attn_v.weight"].T + bias[f"{pre}.v_proj.bias"])
        q = llama.rope(q.reshape(n, llama.N_HEADS, llama.HEAD_DIM), positions)
        k = llama.rope(k.reshape(n, llama.N_KV_HEADS, llama.HEAD_DIM), positions)
        v = v.reshape(n, llama.N_KV_HEADS, llama.HEAD_DIM)
        rep = llama.N_HEADS // llama.N_KV_HEADS
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(llama.HEAD_DIM)
        mask = np.triu(np.ones((n, n), dtype=bool), k=1)
        scores = np.where(mask[None], -np.inf, scores)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, llama.N_HEADS * llama.HEAD_DIM)
        x = x + attn @ t[f"blk.{i}.attn_output.weight"].T
        h = llama.rms_norm(x, t[f"blk.{i}.ffn_norm.weight"])
        gate, up = h @ t[f"blk.{i}.ffn_gate.weight"].T, h @ t[f"blk.{i}.ffn_up.weight"].T
        x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ t[f"blk.{i}.ffn_down.weight"].T
    return llama.rms_norm(x, t["output_norm.weight"]) @ t["output.weight"].T


def main():
    rng = np.random.default_rng(SEED)
    w = make_weights(rng)
    write_hf(w)
    ids = rng.integers(0, llama.VOCAB, llama.N_GOLDEN_TOKENS)
    logits = forward(w, ids)
    no_bias = llama.forward(llama.canonical_from_hf(
        {k: v for k, v in w.items() if not k.endswith(".bias")}), ids)
    golden = {
        "description": "logits of a float64 numpy forward (HF Qwen2 semantics: q/k/v biases) at "
                       "positions 0..n-1 for token_ids, for hf/; 6 significant digits",
        "token_ids": [int(i) for i in ids],
        "logits_shape": [llama.N_GOLDEN_TOKENS, llama.VOCAB],
        "logits": {"hf_f32": llama.sig6(logits)},
    }
    with open(os.path.join(HERE, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    print(f"max |with bias - without| {np.abs(logits - no_bias).max():.3f} "
          f"(logit std {logits.std(axis=-1).mean():.3f})")


if __name__ == "__main__":
    main()
