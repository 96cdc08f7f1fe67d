#!/usr/bin/env python3
"""Writes kvrun's tiny synthetic Llama and the golden logits the GPU path is tested against.

    pip install numpy gguf safetensors tokenizers   # tested: numpy 2.4, gguf 0.19.0,
    python3 assets/tiny-llama/make_tiny_llama.py    #   safetensors 0.8.0, tokenizers 0.23

Deterministic (seeded). Writes, next to this script:
  hf/config.json, hf/model.safetensors (f32), hf/tokenizer.json, hf/tokenizer_config.json
  hf-window/           the same weights as a Mistral with sliding_window 11 (every layer)
  hf-rope-llama3/, hf-rope-linear/  the same weights as a Llama with HF rope_scaling (llama3,
                       linear)
  tiny-llama-f32.gguf  the same weights as GGUF arch llama, all F32, with q/k rows permuted
                       exactly as llama.cpp's convert_hf_to_gguf.py (LlamaModel.permute) does
  tiny-llama-q.gguf    the same, linear weights in a mix of Q8_0, Q4_0, Q4_1 and F16
  golden.json          40 token ids and, per variant, logits [40, 256] of a plain numpy forward

The numpy forward below is written from the HF Llama definition (modeling_llama.py: RMSNorm,
rotate_half RoPE, repeat_kv GQA, causal softmax attention, SwiGLU, final norm, lm head) on the
*unpermuted* HF-layout weights, in float64. It shares no code with kvrun, which is the point: it
is the independent reference. For "gguf_q" it runs on what tiny-llama-q.gguf holds, read back
with gguf-py, dequantized, and q/k rows un-permuted.
"""
import json
import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

OUT = os.path.dirname(os.path.abspath(__file__))
SEED = 1234

N_LAYERS, HIDDEN, N_HEADS, N_KV_HEADS, HEAD_DIM, FFN = 2, 64, 4, 2, 16, 128
VOCAB, MAX_POS, ROPE_THETA, EPS = 256, 256, 10000.0, 1e-5
N_GOLDEN_TOKENS = 40

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Quant type of each linear weight in tiny-llama-q.gguf, by canonical name suffix and layer.
Q_TYPES = {
    0: {"attn_q": Q.Q8_0, "attn_k": Q.Q8_0, "attn_v": Q.Q8_0, "attn_output": Q.F16,
        "ffn_gate": Q.Q4_1, "ffn_up": Q.Q4_1, "ffn_down": Q.Q4_1},
    1: {"attn_q": Q.Q4_0, "attn_k": Q.Q4_0, "attn_v": Q.Q4_1, "attn_output": Q.Q8_0,
        "ffn_gate": Q.Q4_0, "ffn_up": Q.Q4_0, "ffn_down": Q.Q8_0},
}
HF_LINEAR = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}


# Sliding window of hf-window/: smaller than the 40 golden tokens, not a multiple of any block size
# the tests use, so windows start mid-block.
WINDOW = 11

# HF `rope_scaling` of hf-rope-llama3/ and hf-rope-linear/ (the same weights). The llama3 one is
# sized for these 8 frequencies (wavelengths 6.3 … 19,869): with an original context of 32 the
# low/high-frequency wavelengths are 32 and 8, so one frequency is kept, one smoothed and six
# divided by the factor — every branch of HF's `_compute_llama3_parameters`.
ROPE_SCALINGS = {
    "hf-rope-llama3": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 32},
    "hf-rope-linear": {"rope_type": "linear", "factor": 2.0},
}


def make_weights(rng):
    """HF-named float32 weights; Linear weights are [out_features, in_features]."""
    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight():
        return (1.0 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((VOCAB, HIDDEN), 1.0)}
    for i in range(N_LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight()
        # q/k larger than 1/sqrt(in) so attention scores spread over a few units: attention matters.
        w[p + "self_attn.q_proj.weight"] = normal((N_HEADS * HEAD_DIM, HIDDEN), 0.2)
        w[p + "self_attn.k_proj.weight"] = normal((N_KV_HEADS * HEAD_DIM, HIDDEN), 0.2)
        w[p + "self_attn.v_proj.weight"] = normal((N_KV_HEADS * HEAD_DIM, HIDDEN), 0.125)
        w[p + "self_attn.o_proj.weight"] = normal((HIDDEN, N_HEADS * HEAD_DIM), 0.1)
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        w[p + "mlp.gate_proj.weight"] = normal((FFN, HIDDEN), 0.125)
        w[p + "mlp.up_proj.weight"] = normal((FFN, HIDDEN), 0.125)
        w[p + "mlp.down_proj.weight"] = normal((HIDDEN, FFN), 0.06)
    w["model.norm.weight"] = norm_weight()
    w["lm_head.weight"] = normal((VOCAB, HIDDEN), 0.25)
    return w


# --- llama.cpp's Q/K permutation (convert_hf_to_gguf.py, LlamaModel.permute) -----------------

def permute(weights, n_head, n_head_kv):
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


def unpermute(weights, n_head):
    return (weights.reshape(n_head, weights.shape[0] // n_head // 2, 2, *weights.shape[1:])
            .swapaxes(1, 2)
            .reshape(weights.shape))


# --- tokenizer: 256 byte tokens, GPT-2 byte-to-unicode spelling, no merges --------------------

def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def byte_tokens():
    table = bytes_to_unicode()
    return [table[b] for b in range(256)]


def write_hf(w, window=None, rope_dir=None):
    """hf/ (Llama), or with `window` hf-window/: the same weights as a Mistral whose every layer
    attends to the last `window` positions only (HF `sliding_window`), or with `rope_dir` that
    folder: a Llama with ROPE_SCALINGS[rope_dir] as its `rope_scaling`."""
    hf = os.path.join(OUT, rope_dir or ("hf" if window is None else "hf-window"))
    os.makedirs(hf, exist_ok=True)
    arch = ("LlamaForCausalLM", "llama") if window is None else ("MistralForCausalLM", "mistral")
    config = {
        "architectures": [arch[0]], "model_type": arch[1],
        "hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": N_LAYERS,
        "num_attention_heads": N_HEADS, "num_key_value_heads": N_KV_HEADS, "head_dim": HEAD_DIM,
        "vocab_size": VOCAB, "max_position_embeddings": MAX_POS, "rms_norm_eps": EPS,
        "rope_theta": ROPE_THETA, "rope_scaling": None, "tie_word_embeddings": False,
        "attention_bias": False, "hidden_act": "silu", "torch_dtype": "float32",
    }
    if window is not None:
        config["sliding_window"] = window
    if rope_dir is not None:
        config["rope_scaling"] = ROPE_SCALINGS[rope_dir]
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    save_file(w, os.path.join(hf, "model.safetensors"), metadata={"format": "pt"})
    vocab = {t: i for i, t in enumerate(byte_tokens())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(hf, "tokenizer.json"))
    tok_config = {"chat_template": CHAT_TEMPLATE, "bos_token": None, "eos_token": None,
                  "model_max_length": MAX_POS, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(hf, "tokenizer_config.json"), "w") as f:
        json.dump(tok_config, f, indent=2)
        f.write("\n")


def gguf_tensors(w):
    """Canonical GGUF names → float32 arrays (HF layout, q/k rows permuted)."""
    t = {"token_embd.weight": w["model.embed_tokens.weight"],
         "output_norm.weight": w["model.norm.weight"],
         "output.weight": w["lm_head.weight"]}
    for i in range(N_LAYERS):
        p = f"model.layers.{i}."
        t[f"blk.{i}.attn_norm.weight"] = w[p + "input_layernorm.weight"]
        t[f"blk.{i}.ffn_norm.weight"] = w[p + "post_attention_layernorm.weight"]
        for name, hf_name in HF_LINEAR.items():
            t[f"blk.{i}.{name}.weight"] = w[p + hf_name + ".weight"]
        t[f"blk.{i}.attn_q.weight"] = permute(t[f"blk.{i}.attn_q.weight"], N_HEADS, N_HEADS)
        t[f"blk.{i}.attn_k.weight"] = permute(t[f"blk.{i}.attn_k.weight"], N_HEADS, N_KV_HEADS)
    return t


def quant_type(name):
    """The type a tensor gets in tiny-llama-q.gguf."""
    if name == "token_embd.weight" or name == "output.weight":
        return Q.Q8_0
    if name.endswith("norm.weight"):
        return Q.F32
    layer, kind = int(name.split(".")[1]), name.split(".")[2]
    return Q_TYPES[layer][kind]


def write_gguf(path, tensors, quantized):
    wr = gguf.GGUFWriter(path, "llama")
    wr.add_name("kvrun tiny llama")
    wr.add_block_count(N_LAYERS)
    wr.add_context_length(MAX_POS)
    wr.add_embedding_length(HIDDEN)
    wr.add_feed_forward_length(FFN)
    wr.add_head_count(N_HEADS)
    wr.add_head_count_kv(N_KV_HEADS)
    wr.add_layer_norm_rms_eps(EPS)
    wr.add_rope_freq_base(ROPE_THETA)
    wr.add_rope_dimension_count(HEAD_DIM)
    wr.add_vocab_size(VOCAB)
    wr.add_file_type(7 if quantized else 0)  # MOSTLY_Q8_0 (a mix, really) / ALL_F32
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


def hf_weights_from_gguf(path):
    """Read a GGUF back, dequantize, un-permute q/k: HF-layout float arrays by canonical name."""
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        arr = arr.reshape([int(d) for d in reversed(t.shape)])
        if t.name.endswith("attn_q.weight"):
            arr = unpermute(arr, N_HEADS)
        elif t.name.endswith("attn_k.weight"):
            arr = unpermute(arr, N_KV_HEADS)
        out[t.name] = arr
    return out


def canonical_from_hf(w):
    """HF-named weights → canonical names, no permutation (float64)."""
    t = gguf_tensors(w)
    for i in range(N_LAYERS):
        t[f"blk.{i}.attn_q.weight"] = w[f"model.layers.{i}.self_attn.q_proj.weight"]
        t[f"blk.{i}.attn_k.weight"] = w[f"model.layers.{i}.self_attn.k_proj.weight"]
    return {k: v.astype(np.float64) for k, v in t.items()}


# --- the reference forward (HF Llama semantics, float64) ---------------------------------------

def rms_norm(x, weight):
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def inv_freq(scaling=None):
    """HF's rotary inverse frequencies (modeling_rope_utils: default, linear, llama3)."""
    inv = 1.0 / (ROPE_THETA ** (np.arange(0, HEAD_DIM, 2, dtype=np.float64) / HEAD_DIM))
    if scaling is None:
        return inv
    factor = scaling["factor"]
    if scaling["rope_type"] == "linear":
        return inv / factor
    assert scaling["rope_type"] == "llama3"
    old_ctx = scaling["original_max_position_embeddings"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    low_freq_wavelen, high_freq_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * np.pi / inv
    scaled = np.where(wavelen > low_freq_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(medium, smoothed, scaled)


def rope(x, positions, scaling=None):
    """x: [T, heads, head_dim]; HF's rotate_half form (pairs i and i + head_dim/2)."""
    inv_freq_ = inv_freq(scaling)
    freqs = positions[:, None].astype(np.float64) * inv_freq_[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb)[:, None, :], np.sin(emb)[:, None, :]
    return x * cos + rotate_half(x) * sin


def attention(h, t, i, positions, window=None, scaling=None):
    n_tokens = h.shape[0]
    q = (h @ t[f"blk.{i}.attn_q.weight"].T).reshape(n_tokens, N_HEADS, HEAD_DIM)
    k = (h @ t[f"blk.{i}.attn_k.weight"].T).reshape(n_tokens, N_KV_HEADS, HEAD_DIM)
    v = (h @ t[f"blk.{i}.attn_v.weight"].T).reshape(n_tokens, N_KV_HEADS, HEAD_DIM)
    q, k = rope(q, positions, scaling), rope(k, positions, scaling)
    n_rep = N_HEADS // N_KV_HEADS  # repeat_kv: kv head j serves query heads j*n_rep .. j*n_rep+n_rep-1
    k, v = np.repeat(k, n_rep, axis=1), np.repeat(v, n_rep, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(HEAD_DIM)
    mask = np.triu(np.ones((n_tokens, n_tokens), dtype=bool), k=1)
    if window is not None:  # HF sliding window: query p sees keys (p - window, p]
        mask |= np.tril(np.ones((n_tokens, n_tokens), dtype=bool), k=-window)
    scores = np.where(mask[None], -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("hqk,khd->qhd", probs, v).reshape(n_tokens, N_HEADS * HEAD_DIM)
    return out @ t[f"blk.{i}.attn_output.weight"].T


def forward(t, ids, window=None, scaling=None):
    """Logits [len(ids), VOCAB] for tokens at positions 0..len(ids)-1."""
    positions = np.arange(len(ids))
    x = t["token_embd.weight"][ids]
    for i in range(N_LAYERS):
        h = rms_norm(x, t[f"blk.{i}.attn_norm.weight"])
        x = x + attention(h, t, i, positions, window, scaling)
        h = rms_norm(x, t[f"blk.{i}.ffn_norm.weight"])
        gate = h @ t[f"blk.{i}.ffn_gate.weight"].T
        up = h @ t[f"blk.{i}.ffn_up.weight"].T
        x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ t[f"blk.{i}.ffn_down.weight"].T
    return rms_norm(x, t["output_norm.weight"]) @ t["output.weight"].T


def sig6(a):
    return [[float(f"{v:.6g}") for v in row] for row in a]


def main():
    rng = np.random.default_rng(SEED)
    w = make_weights(rng)
    write_hf(w)
    write_hf(w, window=WINDOW)
    for rope_dir in ROPE_SCALINGS:
        write_hf(w, rope_dir=rope_dir)
    f32_path = os.path.join(OUT, "tiny-llama-f32.gguf")
    q_path = os.path.join(OUT, "tiny-llama-q.gguf")
    write_gguf(f32_path, gguf_tensors(w), quantized=False)
    write_gguf(q_path, gguf_tensors(w), quantized=True)

    ids = rng.integers(0, VOCAB, N_GOLDEN_TOKENS)
    hf = canonical_from_hf(w)
    f32_back = hf_weights_from_gguf(f32_path)
    assert all(np.array_equal(hf[k], f32_back[k]) for k in hf), "F32 GGUF does not round-trip"
    logits_hf = forward(hf, ids)
    logits_q = forward(hf_weights_from_gguf(q_path), ids)
    golden = {
        "description": "logits of a float64 numpy forward (HF Llama semantics) at positions "
                       "0..n-1 for token_ids; hf_f32 = hf/ and tiny-llama-f32.gguf, gguf_q = "
                       "tiny-llama-q.gguf as dequantized by gguf-py; hf_window = hf-window/ "
                       "(sliding window of 11 positions); hf_rope_llama3 / hf_rope_linear = "
                       "hf-rope-llama3/ and hf-rope-linear/ (HF rope_scaling); 6 significant "
                       "digits",
        "token_ids": [int(i) for i in ids],
        "logits_shape": [N_GOLDEN_TOKENS, VOCAB],
        "logits": {
            "hf_f32": sig6(logits_hf),
            "gguf_q": sig6(logits_q),
            "hf_window": sig6(forward(hf, ids, window=WINDOW)),
            **{d.replace("-", "_"): sig6(forward(hf, ids, scaling=ROPE_SCALINGS[d]))
               for d in ROPE_SCALINGS},
        },
    }
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")
    spread = logits_hf.std(axis=-1).mean()
    agree = (logits_hf.argmax(-1) == logits_q.argmax(-1)).mean()
    print(f"logit std per position (mean) {spread:.3f}; argmax agreement hf vs q {agree:.3f}; "
          f"max |hf - q| {np.abs(logits_hf - logits_q).max():.4f}")


if __name__ == "__main__":
    main()
