#!/usr/bin/env python3
"""Writes kvrun's tiny synthetic Gemma 3 (text) and the golden logits the GPU path is tested against.

    pip install numpy gguf        # tested: numpy 2.4.6, gguf 0.19.0
    python3 assets/tiny-gemma3/make_tiny_gemma3.py

Deterministic (seeded). Writes, next to this script:
  tiny-gemma3-f32.gguf  GGUF arch gemma3, all F32, named and transformed exactly as llama.cpp's
                        convert_hf_to_gguf.py (Gemma3Model) does: every RMSNorm weight stored as
                        1 + w (HF Gemma computes x · (1 + w)), q/k rows NOT permuted (NEOX RoPE)
  tiny-gemma3-q.gguf    the same, linear weights in a mix of Q8_0, Q4_0, Q4_1 and F16
  golden.json           40 token ids and, per variant, logits [40, 256] of a plain numpy forward

Shape: 6 layers, so llama.cpp's default Gemma 3 pattern (no `sliding_window_pattern` key: every
6th layer global) makes layers 0-4 sliding-window (window 48, RoPE base 10,000) and layer 5
global (RoPE base 1,000,000). hidden 64, 4 query heads / 2 KV heads of head_dim 32 (so
heads · head_dim = 128 differs from hidden, as in Gemma 3 270M: 4 × 256 vs 640),
query_pre_attn_scalar = head_dim, tied embeddings (no output.weight).

The golden sequence (40 tokens) is shorter than the window, so every layer sees all earlier
tokens either way; golden-long.json (120 tokens) runs past it: the forward below implements the
window (HF: key j is visible to query i when i - window < j <= i).

The numpy forward is written from HF's Gemma 3 definition (modeling_gemma3.py: embedding times
sqrt(hidden) rounded to the activation dtype (float32 here, as llama.cpp's sqrtf), Gemma3RMSNorm
x · rsqrt(mean(x²) + eps) · (1 + w), q_norm/k_norm per head before rotate_half RoPE with the layer
type's base, scores scaled by query_pre_attn_scalar^-0.5, repeat_kv GQA, post-attention norm
before the residual add, pre/post-feed-forward norms around down(gelu_tanh(gate) · up), final
norm, tied LM head), in float64. It shares no code with kvrun.
"""
import json
import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

OUT = os.path.dirname(os.path.abspath(__file__))
SEED = 4321

N_LAYERS, HIDDEN, N_HEADS, N_KV_HEADS, HEAD_DIM, FFN = 6, 64, 4, 2, 32, 128
VOCAB, MAX_POS, EPS = 256, 256, 1e-6
ROPE_GLOBAL, ROPE_LOCAL, WINDOW, PATTERN = 1_000_000.0, 10_000.0, 48, 6
QUERY_PRE_ATTN_SCALAR = HEAD_DIM
N_GOLDEN_TOKENS = 40
N_LONG_TOKENS = 120

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<start_of_turn>' + message['role'] + '\n' + message['content'] + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

LINEAR = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]
NORMS = ["attn_norm", "attn_q_norm", "attn_k_norm", "post_attention_norm", "ffn_norm",
         "post_ffw_norm"]
# Quant type of each linear weight in tiny-gemma3-q.gguf, by layer parity.
Q_TYPES = {
    0: {"attn_q": Q.Q8_0, "attn_k": Q.Q8_0, "attn_v": Q.Q4_1, "attn_output": Q.F16,
        "ffn_gate": Q.Q4_1, "ffn_up": Q.Q4_1, "ffn_down": Q.Q8_0},
    1: {"attn_q": Q.Q4_0, "attn_k": Q.Q4_0, "attn_v": Q.Q8_0, "attn_output": Q.Q8_0,
        "ffn_gate": Q.Q4_0, "ffn_up": Q.Q4_0, "ffn_down": Q.Q4_1},
}


def is_sliding(layer):
    """llama.cpp's set_swa_pattern(6): layer il is sliding unless il % 6 == 5 (HF layer_types)."""
    return layer % PATTERN < PATTERN - 1


def make_weights(rng):
    """GGUF-named float32 weights as the converter writes them: Linear [out, in], norms 1 + w."""
    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight(n):
        # HF holds w (zero-centred); the converter stores 1 + w
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {"token_embd.weight": normal((VOCAB, HIDDEN), 0.15)}
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = norm_weight(HIDDEN)
        t[p + "attn_q.weight"] = normal((N_HEADS * HEAD_DIM, HIDDEN), 0.15)
        t[p + "attn_k.weight"] = normal((N_KV_HEADS * HEAD_DIM, HIDDEN), 0.15)
        t[p + "attn_v.weight"] = normal((N_KV_HEADS * HEAD_DIM, HIDDEN), 0.15)
        # q/k norms big enough that scores (scaled by 1/sqrt(32)) spread over a few units
        t[p + "attn_q_norm.weight"] = (1.5 + 0.3 * rng.standard_normal(HEAD_DIM)).astype(np.float32)
        t[p + "attn_k_norm.weight"] = (1.5 + 0.3 * rng.standard_normal(HEAD_DIM)).astype(np.float32)
        t[p + "attn_output.weight"] = normal((HIDDEN, N_HEADS * HEAD_DIM), 0.1)
        t[p + "post_attention_norm.weight"] = norm_weight(HIDDEN)
        t[p + "ffn_norm.weight"] = norm_weight(HIDDEN)
        t[p + "ffn_gate.weight"] = normal((FFN, HIDDEN), 0.15)
        t[p + "ffn_up.weight"] = normal((FFN, HIDDEN), 0.15)
        t[p + "ffn_down.weight"] = normal((HIDDEN, FFN), 0.1)
        t[p + "post_ffw_norm.weight"] = norm_weight(HIDDEN)
    t["output_norm.weight"] = norm_weight(HIDDEN)
    return t


def byte_tokens():
    """256 byte tokens in GPT-2's byte-to-unicode spelling (as the tiny Llama)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = {b: chr(c) for b, c in zip(bs, cs)}
    return [table[b] for b in range(256)]


def quant_type(name):
    if name == "token_embd.weight":
        return Q.Q8_0
    if name.endswith("norm.weight"):
        return Q.F32
    layer, kind = int(name.split(".")[1]), name.split(".")[2]
    return Q_TYPES[layer % 2][kind]


def write_gguf(path, tensors, quantized):
    wr = gguf.GGUFWriter(path, "gemma3")
    wr.add_name("kvrun tiny gemma3")
    wr.add_block_count(N_LAYERS)
    wr.add_context_length(MAX_POS)
    wr.add_embedding_length(HIDDEN)
    wr.add_feed_forward_length(FFN)
    wr.add_head_count(N_HEADS)
    wr.add_head_count_kv(N_KV_HEADS)
    wr.add_key_length(HEAD_DIM)
    wr.add_value_length(HEAD_DIM)
    wr.add_layer_norm_rms_eps(EPS)
    wr.add_rope_freq_base(ROPE_GLOBAL)
    wr.add_sliding_window(WINDOW)
    wr.add_file_type(7 if quantized else 0)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt-2")
    wr.add_token_list(byte_tokens())
    wr.add_token_types([gguf.TokenType.NORMAL] * VOCAB)
    wr.add_add_bos_token(False)
    wr.add_chat_template(CHAT_TEMPLATE)
    for name, arr in tensors.items():
        ty = quant_type(name) if quantized else Q.F32
        if ty == Q.F32:
            wr.add_tensor(name, arr)
        elif ty == Q.F16:
            wr.add_tensor(name, arr.astype(np.float16))
        else:
            wr.add_tensor(name, gguf.quants.quantize(arr, ty), raw_dtype=ty)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def read_back(path):
    """A GGUF's tensors dequantized by gguf-py, float64, [rows, cols]."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        out[t.name] = arr.reshape([int(d) for d in reversed(t.shape)])
    return out


# --- the reference forward (HF Gemma 3 semantics, float64) -----------------------------------

def rms_norm(x, stored_weight):
    """Gemma3RMSNorm with the GGUF weight (= 1 + HF weight)."""
    return (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS)) * stored_weight


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def rope(x, positions, base):
    """x: [T, heads, head_dim]; HF's rotate_half form (pairs i and i + head_dim/2)."""
    inv_freq = 1.0 / (base ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM))
    freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    return x * cos + rotate_half(x) * sin


def gelu_tanh(x):
    """HF's gelu_pytorch_tanh."""
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def attention(h, t, i, positions):
    n = h.shape[0]
    p = f"blk.{i}."
    q = (h @ t[p + "attn_q.weight"].T).reshape(n, N_HEADS, HEAD_DIM)
    k = (h @ t[p + "attn_k.weight"].T).reshape(n, N_KV_HEADS, HEAD_DIM)
    v = (h @ t[p + "attn_v.weight"].T).reshape(n, N_KV_HEADS, HEAD_DIM)
    q, k = rms_norm(q, t[p + "attn_q_norm.weight"]), rms_norm(k, t[p + "attn_k_norm.weight"])
    base = ROPE_LOCAL if is_sliding(i) else ROPE_GLOBAL
    q, k = rope(q, positions, base), rope(k, positions, base)
    n_rep = N_HEADS // N_KV_HEADS
    k, v = np.repeat(k, n_rep, axis=1), np.repeat(v, n_rep, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) * QUERY_PRE_ATTN_SCALAR ** -0.5
    qi, kj = positions[:, None], positions[None, :]
    visible = kj <= qi
    if is_sliding(i):
        visible &= kj > qi - WINDOW
    scores = np.where(visible[None], scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", probs, v).reshape(n, N_HEADS * HEAD_DIM)
    return out @ t[p + "attn_output.weight"].T


def forward(t, ids):
    """Logits [len(ids), VOCAB] for tokens at positions 0..len(ids)-1."""
    positions = np.arange(len(ids))
    # HF: normalizer = torch.tensor(hidden_size**0.5, dtype=hidden.dtype), float32 here
    x = t["token_embd.weight"][ids] * np.float64(np.float32(HIDDEN ** 0.5))
    for i in range(N_LAYERS):
        p = f"blk.{i}."
        a = attention(rms_norm(x, t[p + "attn_norm.weight"]), t, i, positions)
        x = x + rms_norm(a, t[p + "post_attention_norm.weight"])
        h = rms_norm(x, t[p + "ffn_norm.weight"])
        ffn = (gelu_tanh(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)) \
            @ t[p + "ffn_down.weight"].T
        x = x + rms_norm(ffn, t[p + "post_ffw_norm.weight"])
    return rms_norm(x, t["output_norm.weight"]) @ t["token_embd.weight"].T


def sig6(a):
    return [[float(f"{v:.6g}") for v in row] for row in a]


def main():
    rng = np.random.default_rng(SEED)
    tensors = make_weights(rng)
    f32_path = os.path.join(OUT, "tiny-gemma3-f32.gguf")
    q_path = os.path.join(OUT, "tiny-gemma3-q.gguf")
    write_gguf(f32_path, tensors, quantized=False)
    write_gguf(q_path, tensors, quantized=True)

    ids = rng.integers(0, VOCAB, N_GOLDEN_TOKENS)
    f32 = read_back(f32_path)
    assert all(np.array_equal(tensors[k].astype(np.float64), f32[k]) for k in tensors), \
        "F32 GGUF does not round-trip"
    logits_f32 = forward(f32, ids)
    logits_q = forward(read_back(q_path), ids)
    golden = {
        "description": "logits of a float64 numpy forward (HF Gemma 3 semantics) at positions "
                       "0..n-1 for token_ids; f32 = tiny-gemma3-f32.gguf, gguf_q = "
                       "tiny-gemma3-q.gguf as dequantized by gguf-py; 6 significant digits",
        "token_ids": [int(i) for i in ids],
        "sliding_window": WINDOW,
        "sliding_layers": [i for i in range(N_LAYERS) if is_sliding(i)],
        "logits_shape": [N_GOLDEN_TOKENS, VOCAB],
        "logits": {"f32": sig6(logits_f32), "gguf_q": sig6(logits_q)},
    }
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    # Past the window: 120 tokens (2.5 windows), drawn after the short golden's (which this
    # leaves unchanged), f32 weights only.
    long_ids = rng.integers(0, VOCAB, N_LONG_TOKENS)
    long = {
        "description": "like golden.json over 120 tokens, past the 48-token window of the "
                       "sliding layers (f32 only)",
        "token_ids": [int(i) for i in long_ids],
        "sliding_window": WINDOW,
        "logits_shape": [N_LONG_TOKENS, VOCAB],
        "logits": {"f32": sig6(forward(f32, long_ids))},
    }
    with open(os.path.join(OUT, "golden-long.json"), "w") as f:
        json.dump(long, f, separators=(",", ":"))
        f.write("\n")
    spread = logits_f32.std(axis=-1).mean()
    agree = (logits_f32.argmax(-1) == logits_q.argmax(-1)).mean()
    print(f"logit std per position (mean) {spread:.3f}; argmax agreement f32 vs q {agree:.3f}; "
          f"max |f32 - q| {np.abs(logits_f32 - logits_q).max():.4f}")


if __name__ == "__main__":
    main()
