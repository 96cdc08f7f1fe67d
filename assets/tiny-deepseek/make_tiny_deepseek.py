#!/usr/bin/env python3
"""Writes kvrun's tiny synthetic DeepSeek-V2 (MLA attention) and the golden logits it is tested against.

    pip install numpy gguf safetensors tokenizers   # tested: numpy 2.4, gguf 0.19.0,
    python3 assets/tiny-deepseek/make_tiny_deepseek.py   #   safetensors 0.8.0, tokenizers 0.23

Deterministic (seeded). Writes, next to this script:
  hf/config.json, hf/model.safetensors (f32), hf/tokenizer.json, hf/tokenizer_config.json
                       a DeepseekV2ForCausalLM with q-LoRA (q_lora_rank 32), every layer dense
                       (first_k_dense_replace = num_hidden_layers)
  hf-no-qlora/         the same, "q_lora_rank": null, with its own q_proj weights (all other
                       weights those of hf/)
  hf-yarn/             the weights of hf/ with a DeepSeek YaRN rope_scaling (factor 4, original
                       context 32, mscale 1.0 != mscale_all_dim 0.8, so both the cos/sin factor
                       and the softmax-scale factor are exercised)
  hf-moe/config.json   config only, no weights: hf/ with first_k_dense_replace 1, so layer 1 is a
                       mixture-of-experts layer whose tensors hf/ lacks (for the test that kvrun
                       refuses it by the missing tensor's name)
  tiny-deepseek-f32.gguf  the weights of hf/ as GGUF arch deepseek2, all F32, in llama.cpp's
                       current convert_hf_to_gguf.py layout for MLA (DeepseekV2Model): MLA as MQA
                       over the latent — head_count_kv 1, key_length kv_lora_rank + qk_rope (128),
                       value_length kv_lora_rank (96), the per-head widths under key_length_mla
                       (64) / value_length_mla (32) — and kv_b_proj split per head into attn_k_b
                       [H, R, NOPE] (transposed) and attn_v_b [H, V, R]; no attn_kv_b
  tiny-deepseek-q.gguf the weights of hf-no-qlora/ (attn_q) in the older converter layout (before
                       llama.cpp's MLA rework): head_count_kv = heads (4), key_length qk_nope +
                       qk_rope (64), value_length v_head_dim (32), no *_mla keys, attn_kv_b as one
                       [H*(NOPE+V), R] tensor; linear weights Q8_0 (attn_q, attn_kv_a_mqa,
                       attn_kv_b, ffn_gate, ffn_up, token_embd, output) and F16 (attn_output,
                       ffn_down), norms F32
  golden.json          40 token ids and, per variant, logits [40, 256] of a plain numpy forward

The numpy forward below is written from HF's DeepSeek-V2 definition (modeling_deepseek.py of
deepseek-ai/DeepSeek-V2-Lite: DeepseekV2Attention in its expanded form — q_a/q_b or q_proj,
kv_a_proj_with_mqa split into the latent and one shared RoPE key, kv_a_layernorm, kv_b_proj into
per-head k_nope and v; apply_rotary_pos_emb with its de-interleave of q_pe/k_pe before
rotate_half; DeepseekV2YarnRotaryEmbedding; softmax_scale times mscale(mscale_all_dim)^2; RMSNorm,
SwiGLU, final norm, lm head) on the HF-layout weights, in float64. It shares no code with kvrun,
which is the point: it is the independent reference. For "gguf_q" it runs on what
tiny-deepseek-q.gguf holds, read back with gguf-py and dequantized; tiny-deepseek-f32.gguf is
asserted to read back (k_b/v_b re-joined into kv_b) bit-identical to hf/, so its expected logits
are "hf_qlora". Neither GGUF permutes q/k rows: llama.cpp's DeepseekV2Model converter does not,
its deepseek2 RoPE is the NORM kind (adjacent pairs), the same rotation HF DeepSeek applies after
de-interleaving.

As a self-check it also runs the *absorbed* form of MLA (what a latent KV cache computes: the
query's nope part folded through W_UK into the latent space, scores against the normed latent plus
the RoPE part, output folded through W_UV), with RoPE applied to interleaved pairs (2i, 2i+1) in
place instead of HF's de-interleave + rotate_half, and asserts that scores and logits agree with
the expanded form: the permutation is the same on query and key, so dot products are unchanged.
"""
import json
import math
import os

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

OUT = os.path.dirname(os.path.abspath(__file__))
SEED = 1234

N_LAYERS, HIDDEN, N_HEADS, FFN = 2, 64, 4, 128
VOCAB, MAX_POS, ROPE_THETA, EPS = 256, 256, 10000.0, 1e-6
KV_LORA_RANK, QK_ROPE_HEAD_DIM, QK_NOPE_HEAD_DIM, V_HEAD_DIM = 96, 32, 32, 32
Q_LORA_RANK = 32
Q_HEAD_DIM = QK_NOPE_HEAD_DIM + QK_ROPE_HEAD_DIM
N_GOLDEN_TOKENS = 40

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# DeepSeek-style YaRN of hf-yarn/. For the 16 RoPE frequencies (dim 32, base 10^4) and an original
# context of 32, yarn_find_correction_range gives low 0, high 3: frequency 0 is kept, 1 and 2 are
# blended and 3..15 are divided by the factor. mscale != mscale_all_dim makes the cos/sin factor
# (mscale(1.0)/mscale(0.8) ≈ 1.025) differ from 1, next to the softmax factor mscale(0.8)^2 ≈ 1.234.
YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}


def make_weights(rng):
    """HF-named float32 weights of hf/ (q-LoRA); Linear weights are [out_features, in_features]."""
    def normal(shape, std):
        return (rng.standard_normal(shape) * std).astype(np.float32)

    def norm_weight(n=HIDDEN):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"model.embed_tokens.weight": normal((VOCAB, HIDDEN), 1.0)}
    for i in range(N_LAYERS):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm_weight()
        # q/k larger than 1/sqrt(in) so attention scores spread over a few units: attention matters.
        w[p + "self_attn.q_a_proj.weight"] = normal((Q_LORA_RANK, HIDDEN), 0.2)
        w[p + "self_attn.q_a_layernorm.weight"] = norm_weight(Q_LORA_RANK)
        w[p + "self_attn.q_b_proj.weight"] = normal((N_HEADS * Q_HEAD_DIM, Q_LORA_RANK), 0.25)
        w[p + "self_attn.kv_a_proj_with_mqa.weight"] = normal(
            (KV_LORA_RANK + QK_ROPE_HEAD_DIM, HIDDEN), 0.2)
        w[p + "self_attn.kv_a_layernorm.weight"] = norm_weight(KV_LORA_RANK)
        w[p + "self_attn.kv_b_proj.weight"] = normal(
            (N_HEADS * (QK_NOPE_HEAD_DIM + V_HEAD_DIM), KV_LORA_RANK), 0.15)
        w[p + "self_attn.o_proj.weight"] = normal((HIDDEN, N_HEADS * V_HEAD_DIM), 0.1)
        w[p + "post_attention_layernorm.weight"] = norm_weight()
        w[p + "mlp.gate_proj.weight"] = normal((FFN, HIDDEN), 0.125)
        w[p + "mlp.up_proj.weight"] = normal((FFN, HIDDEN), 0.125)
        w[p + "mlp.down_proj.weight"] = normal((HIDDEN, FFN), 0.06)
    w["model.norm.weight"] = norm_weight()
    w["lm_head.weight"] = normal((VOCAB, HIDDEN), 0.25)
    return w


def no_qlora_weights(w, rng):
    """hf-no-qlora/: the weights of hf/ without q_a/q_b, each layer with its own q_proj."""
    out = {k: v for k, v in w.items() if ".q_a_" not in k and ".q_b_" not in k}
    for i in range(N_LAYERS):
        out[f"model.layers.{i}.self_attn.q_proj.weight"] = (
            rng.standard_normal((N_HEADS * Q_HEAD_DIM, HIDDEN)) * 0.2).astype(np.float32)
    return out


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


def hf_config(q_lora=True, rope_scaling=None, first_k_dense_replace=N_LAYERS):
    return {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "hidden_size": HIDDEN, "intermediate_size": FFN, "moe_intermediate_size": 32,
        "num_hidden_layers": N_LAYERS, "num_attention_heads": N_HEADS,
        "num_key_value_heads": N_HEADS, "n_shared_experts": 1, "n_routed_experts": 4,
        "num_experts_per_tok": 2, "moe_layer_freq": 1,
        "first_k_dense_replace": first_k_dense_replace,
        "q_lora_rank": Q_LORA_RANK if q_lora else None, "kv_lora_rank": KV_LORA_RANK,
        "qk_rope_head_dim": QK_ROPE_HEAD_DIM, "qk_nope_head_dim": QK_NOPE_HEAD_DIM,
        "v_head_dim": V_HEAD_DIM, "vocab_size": VOCAB, "max_position_embeddings": MAX_POS,
        "rms_norm_eps": EPS, "rope_theta": ROPE_THETA, "rope_scaling": rope_scaling,
        "tie_word_embeddings": False, "attention_bias": False, "hidden_act": "silu",
        "topk_method": "greedy", "scoring_func": "softmax", "norm_topk_prob": False,
        "routed_scaling_factor": 1.0, "torch_dtype": "float32",
        "bos_token_id": None, "eos_token_id": None,
    }


def write_config(folder, config):
    hf = os.path.join(OUT, folder)
    os.makedirs(hf, exist_ok=True)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return hf


def write_hf(folder, w, config):
    """folder/: config.json, model.safetensors, tokenizer.json, tokenizer_config.json."""
    hf = write_config(folder, config)
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


# --- GGUF (arch deepseek2, llama.cpp's canonical tensor names) --------------------------------

ARCH = gguf.MODEL_ARCH.DEEPSEEK2
# canonical GGUF tensor → HF module (".weight" on both sides); kv_b_proj is handled per layout.
GGUF_LAYER = {
    gguf.MODEL_TENSOR.ATTN_NORM: "input_layernorm",
    gguf.MODEL_TENSOR.ATTN_Q: "self_attn.q_proj",
    gguf.MODEL_TENSOR.ATTN_Q_A: "self_attn.q_a_proj",
    gguf.MODEL_TENSOR.ATTN_Q_A_NORM: "self_attn.q_a_layernorm",
    gguf.MODEL_TENSOR.ATTN_Q_B: "self_attn.q_b_proj",
    gguf.MODEL_TENSOR.ATTN_KV_A_MQA: "self_attn.kv_a_proj_with_mqa",
    gguf.MODEL_TENSOR.ATTN_KV_A_NORM: "self_attn.kv_a_layernorm",
    gguf.MODEL_TENSOR.ATTN_KV_B: "self_attn.kv_b_proj",
    gguf.MODEL_TENSOR.ATTN_OUT: "self_attn.o_proj",
    gguf.MODEL_TENSOR.FFN_NORM: "post_attention_layernorm",
    gguf.MODEL_TENSOR.FFN_GATE: "mlp.gate_proj",
    gguf.MODEL_TENSOR.FFN_UP: "mlp.up_proj",
    gguf.MODEL_TENSOR.FFN_DOWN: "mlp.down_proj",
}
GGUF_GLOBAL = {gguf.MODEL_TENSOR.TOKEN_EMBD: "model.embed_tokens",
               gguf.MODEL_TENSOR.OUTPUT_NORM: "model.norm",
               gguf.MODEL_TENSOR.OUTPUT: "lm_head"}
# Types of the linear weights in tiny-deepseek-q.gguf (everything else, the norms, stays F32).
Q_TYPES = {gguf.MODEL_TENSOR.ATTN_Q: Q.Q8_0, gguf.MODEL_TENSOR.ATTN_KV_A_MQA: Q.Q8_0,
           gguf.MODEL_TENSOR.ATTN_KV_B: Q.Q8_0, gguf.MODEL_TENSOR.FFN_GATE: Q.Q8_0,
           gguf.MODEL_TENSOR.FFN_UP: Q.Q8_0, gguf.MODEL_TENSOR.TOKEN_EMBD: Q.Q8_0,
           gguf.MODEL_TENSOR.OUTPUT: Q.Q8_0, gguf.MODEL_TENSOR.ATTN_OUT: Q.F16,
           gguf.MODEL_TENSOR.FFN_DOWN: Q.F16}


def tensor_name(kind, i=None):
    assert kind in gguf.MODEL_TENSORS[ARCH], kind
    name = gguf.TENSOR_NAMES[kind]
    return (name if i is None else name.format(bid=i)) + ".weight"


def gguf_tensors(w, split_kv_b):
    """Canonical GGUF name → (MODEL_TENSOR, float32 array in the converter's layout). No q/k row
    permutation (deepseek2 is not permuted). With split_kv_b, kv_b_proj [H*(NOPE+V), R] becomes
    llama.cpp's current per-head pair, as DeepseekV2Model.modify_tensors does:
    attn_k_b = kv_b[:, :NOPE, :].transpose → [H, R, NOPE], attn_v_b = kv_b[:, NOPE:, :] [H, V, R]."""
    t = {}
    for kind, hf_name in GGUF_GLOBAL.items():
        t[tensor_name(kind)] = (kind, w[hf_name + ".weight"])
    for i in range(N_LAYERS):
        for kind, hf_name in GGUF_LAYER.items():
            key = f"model.layers.{i}.{hf_name}.weight"
            if key not in w:
                continue
            if kind == gguf.MODEL_TENSOR.ATTN_KV_B and split_kv_b:
                kv_b = w[key].reshape(N_HEADS, QK_NOPE_HEAD_DIM + V_HEAD_DIM, KV_LORA_RANK)
                k_b = np.ascontiguousarray(kv_b[:, :QK_NOPE_HEAD_DIM, :].transpose(0, 2, 1))
                v_b = np.ascontiguousarray(kv_b[:, QK_NOPE_HEAD_DIM:, :])
                t[tensor_name(gguf.MODEL_TENSOR.ATTN_K_B, i)] = (gguf.MODEL_TENSOR.ATTN_K_B, k_b)
                t[tensor_name(gguf.MODEL_TENSOR.ATTN_V_B, i)] = (gguf.MODEL_TENSOR.ATTN_V_B, v_b)
            else:
                t[tensor_name(kind, i)] = (kind, w[key])
    return t


def write_gguf(path, w, current_layout, quantized):
    """current_layout: llama.cpp's converter since its MLA rework (MQA over the latent, split
    k_b/v_b, *_mla keys); otherwise the older one (per-head K/V widths, attn_kv_b)."""
    q_lora = any(".q_a_proj." in k for k in w)
    wr = gguf.GGUFWriter(path, "deepseek2")
    wr.add_name("kvrun tiny deepseek")
    wr.add_block_count(N_LAYERS)
    wr.add_context_length(MAX_POS)
    wr.add_embedding_length(HIDDEN)
    wr.add_feed_forward_length(FFN)
    wr.add_head_count(N_HEADS)
    wr.add_layer_norm_rms_eps(EPS)
    wr.add_rope_freq_base(ROPE_THETA)
    wr.add_rope_dimension_count(QK_ROPE_HEAD_DIM)
    wr.add_leading_dense_block_count(N_LAYERS)  # every layer dense
    if q_lora:
        wr.add_q_lora_rank(Q_LORA_RANK)
    wr.add_kv_lora_rank(KV_LORA_RANK)
    if current_layout:
        wr.add_head_count_kv(1)
        wr.add_key_length(KV_LORA_RANK + QK_ROPE_HEAD_DIM)
        wr.add_value_length(KV_LORA_RANK)
        wr.add_key_length_mla(Q_HEAD_DIM)
        wr.add_value_length_mla(V_HEAD_DIM)
    else:
        wr.add_head_count_kv(N_HEADS)
        wr.add_key_length(Q_HEAD_DIM)
        wr.add_value_length(V_HEAD_DIM)
    wr.add_vocab_size(VOCAB)
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if quantized else gguf.LlamaFileType.ALL_F32)
    wr.add_tokenizer_model("gpt2")
    wr.add_tokenizer_pre("gpt-2")
    wr.add_token_list(byte_tokens())
    wr.add_token_types([gguf.TokenType.NORMAL] * VOCAB)
    wr.add_add_bos_token(False)
    wr.add_chat_template(CHAT_TEMPLATE)
    for name, (kind, arr) in gguf_tensors(w, split_kv_b=current_layout).items():
        ty = Q_TYPES.get(kind, Q.F32) if quantized else Q.F32
        if ty == Q.F32:
            wr.add_tensor(name, arr)
        elif ty == Q.F16:
            wr.add_tensor(name, arr.astype(np.float16))
        else:
            assert arr.shape[-1] % 32 == 0, name
            wr.add_tensor(name, gguf.quants.quantize(arr, ty), raw_dtype=ty)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def gguf_metadata(path):
    """Scalar metadata of a GGUF (arrays left out), key → value."""
    out = {}
    for name, field in gguf.GGUFReader(path).fields.items():
        if field.types and field.types[0] != gguf.GGUFValueType.ARRAY:
            out[name] = field.contents()
    return out


def hf_weights_from_gguf(path):
    """Read a GGUF back with gguf-py, dequantize (float64), map canonical names back to HF names;
    attn_k_b/attn_v_b are re-joined into kv_b_proj [H*(NOPE+V), R]."""
    to_hf = {tensor_name(kind): hf for kind, hf in GGUF_GLOBAL.items()}
    for i in range(N_LAYERS):
        for kind, hf in GGUF_LAYER.items():
            to_hf[tensor_name(kind, i)] = f"model.layers.{i}.{hf}"
    out, k_b, v_b = {}, {}, {}
    for t in gguf.GGUFReader(path).tensors:
        arr = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64)
        arr = arr.reshape([int(d) for d in reversed(t.shape)])
        layer = t.name.split(".")[1] if t.name.startswith("blk.") else None
        if t.name.endswith(".attn_k_b.weight"):
            k_b[int(layer)] = arr
        elif t.name.endswith(".attn_v_b.weight"):
            v_b[int(layer)] = arr
        else:
            out[to_hf[t.name] + ".weight"] = arr
    assert k_b.keys() == v_b.keys()
    for i in k_b:
        assert k_b[i].shape == (N_HEADS, KV_LORA_RANK, QK_NOPE_HEAD_DIM), k_b[i].shape
        assert v_b[i].shape == (N_HEADS, V_HEAD_DIM, KV_LORA_RANK), v_b[i].shape
        kv_b = np.concatenate([k_b[i].transpose(0, 2, 1), v_b[i]], axis=1)
        out[f"model.layers.{i}.self_attn.kv_b_proj.weight"] = kv_b.reshape(-1, KV_LORA_RANK)
    return out


def check_gguf_metadata(path, current_layout, q_lora):
    arch = "deepseek2"
    want = {
        "general.architecture": arch, f"{arch}.block_count": N_LAYERS,
        f"{arch}.context_length": MAX_POS, f"{arch}.embedding_length": HIDDEN,
        f"{arch}.feed_forward_length": FFN, f"{arch}.attention.head_count": N_HEADS,
        f"{arch}.rope.dimension_count": QK_ROPE_HEAD_DIM,
        f"{arch}.leading_dense_block_count": N_LAYERS,
        f"{arch}.attention.kv_lora_rank": KV_LORA_RANK, f"{arch}.vocab_size": VOCAB,
        f"{arch}.rope.freq_base": ROPE_THETA,
        "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.add_bos_token": False, "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    if current_layout:
        want.update({f"{arch}.attention.head_count_kv": 1,
                     f"{arch}.attention.key_length": KV_LORA_RANK + QK_ROPE_HEAD_DIM,
                     f"{arch}.attention.value_length": KV_LORA_RANK,
                     f"{arch}.attention.key_length_mla": Q_HEAD_DIM,
                     f"{arch}.attention.value_length_mla": V_HEAD_DIM})
    else:
        want.update({f"{arch}.attention.head_count_kv": N_HEADS,
                     f"{arch}.attention.key_length": Q_HEAD_DIM,
                     f"{arch}.attention.value_length": V_HEAD_DIM})
    if q_lora:
        want[f"{arch}.attention.q_lora_rank"] = Q_LORA_RANK
    got = gguf_metadata(path)
    for k, v in want.items():
        assert k in got and got[k] == v, (path, k, got.get(k), v)
    absent = [] if q_lora else [f"{arch}.attention.q_lora_rank"]
    if not current_layout:
        absent += [f"{arch}.attention.key_length_mla", f"{arch}.attention.value_length_mla"]
    assert not any(k in got for k in absent), (path, absent)
    assert abs(got[f"{arch}.attention.layer_norm_rms_epsilon"] - EPS) < 1e-12


# --- the reference forward (HF DeepSeek-V2 semantics, float64) ---------------------------------

def rms_norm(x, weight):
    return weight * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS))


def rotate_half(x):
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def yarn_find_correction_dim(num_rotations, dim, base, max_pos):
    return (dim * math.log(max_pos / (num_rotations * 2 * math.pi))) / (2 * math.log(base))


def yarn_find_correction_range(low_rot, high_rot, dim, base, max_pos):
    low = math.floor(yarn_find_correction_dim(low_rot, dim, base, max_pos))
    high = math.ceil(yarn_find_correction_dim(high_rot, dim, base, max_pos))
    return max(low, 0), min(high, dim - 1)


def yarn_get_mscale(scale=1.0, mscale=1.0):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def rotary(scaling=None):
    """(inv_freq [ROPE/2], cos/sin factor) of DeepseekV2RotaryEmbedding / ...YarnRotaryEmbedding."""
    dim, base = QK_ROPE_HEAD_DIM, ROPE_THETA
    freq_extra = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if scaling is None:
        return freq_extra, 1.0
    assert scaling["type"] == "yarn"
    factor = scaling["factor"]
    freq_inter = 1.0 / (factor * base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    low, high = yarn_find_correction_range(scaling.get("beta_fast", 32), scaling.get("beta_slow", 1),
                                           dim, base,
                                           scaling.get("original_max_position_embeddings", 4096))
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    inv_freq_mask = 1.0 - ramp
    inv_freq = freq_inter * (1.0 - inv_freq_mask) + freq_extra * inv_freq_mask
    m = yarn_get_mscale(factor, scaling.get("mscale", 1)) / \
        yarn_get_mscale(factor, scaling.get("mscale_all_dim", 0))
    return inv_freq, m


def rope_hf(x, positions, scaling=None):
    """x: [T, heads, ROPE]; HF DeepSeek's apply_rotary_pos_emb: de-interleave, then rotate_half."""
    inv_freq, m = rotary(scaling)
    freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = (np.cos(emb) * m)[:, None, :], (np.sin(emb) * m)[:, None, :]
    d = x.shape[-1]
    x = x.reshape(*x.shape[:-1], d // 2, 2).swapaxes(-1, -2).reshape(x.shape)
    return x * cos + rotate_half(x) * sin


def rope_interleaved(x, positions, scaling=None):
    """The same rotation applied in place to pairs (2i, 2i+1) — no permutation (self-check only)."""
    inv_freq, m = rotary(scaling)
    freqs = positions[:, None].astype(np.float64) * inv_freq[None, :]
    cos, sin = (np.cos(freqs) * m)[:, None, :], (np.sin(freqs) * m)[:, None, :]
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = a * cos - b * sin
    out[..., 1::2] = a * sin + b * cos
    return out


def softmax_scale(scaling=None):
    s = Q_HEAD_DIM ** -0.5
    if scaling is not None:
        mscale_all_dim = scaling.get("mscale_all_dim", 0)
        if mscale_all_dim:
            m = yarn_get_mscale(scaling["factor"], mscale_all_dim)
            s = s * m * m
    return s


def causal_softmax(scores):
    """scores [H, Tq, Tk]."""
    n = scores.shape[-1]
    mask = np.triu(np.ones((n, n), dtype=bool), k=1)
    scores = np.where(mask[None], -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    return probs / probs.sum(axis=-1, keepdims=True)


def mla_inputs(h, w, i):
    """q [T, H, NOPE+ROPE], normed latent c [T, R], raw k_pe [T, ROPE], kv_b [H, NOPE+V, R]."""
    p = f"model.layers.{i}.self_attn."
    n_tokens = h.shape[0]
    if p + "q_proj.weight" in w:
        q = h @ w[p + "q_proj.weight"].T
    else:
        q = rms_norm(h @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"]) \
            @ w[p + "q_b_proj.weight"].T
    q = q.reshape(n_tokens, N_HEADS, Q_HEAD_DIM)
    ckv = h @ w[p + "kv_a_proj_with_mqa.weight"].T
    compressed, k_pe = ckv[:, :KV_LORA_RANK], ckv[:, KV_LORA_RANK:]
    c = rms_norm(compressed, w[p + "kv_a_layernorm.weight"])
    kv_b = w[p + "kv_b_proj.weight"].reshape(N_HEADS, QK_NOPE_HEAD_DIM + V_HEAD_DIM, KV_LORA_RANK)
    return q, c, k_pe, kv_b


def attention_expanded(h, w, i, positions, scaling=None):
    """HF DeepseekV2Attention.forward (eager), one sequence."""
    n_tokens = h.shape[0]
    q, c, k_pe, kv_b = mla_inputs(h, w, i)
    q_nope, q_pe = q[..., :QK_NOPE_HEAD_DIM], q[..., QK_NOPE_HEAD_DIM:]
    kv = (c @ kv_b.reshape(-1, KV_LORA_RANK).T).reshape(
        n_tokens, N_HEADS, QK_NOPE_HEAD_DIM + V_HEAD_DIM)
    k_nope, v = kv[..., :QK_NOPE_HEAD_DIM], kv[..., QK_NOPE_HEAD_DIM:]
    q_pe = rope_hf(q_pe, positions, scaling)
    k_pe = rope_hf(k_pe[:, None, :], positions, scaling)  # one head, shared by all heads
    query = np.concatenate([q_nope, q_pe], axis=-1)
    key = np.concatenate([k_nope, np.broadcast_to(k_pe, (n_tokens, N_HEADS, QK_ROPE_HEAD_DIM))],
                         axis=-1)
    scores = np.einsum("qhd,khd->hqk", query, key) * softmax_scale(scaling)
    probs = causal_softmax(scores)
    out = np.einsum("hqk,khd->qhd", probs, v).reshape(n_tokens, N_HEADS * V_HEAD_DIM)
    return out @ w[f"model.layers.{i}.self_attn.o_proj.weight"].T, scores


def attention_absorbed(h, w, i, positions, scaling=None):
    """The same attention over a latent cache (c, k_pe): W_UK folded into the query, W_UV into the
    output; RoPE on interleaved pairs in place (self-check only)."""
    n_tokens = h.shape[0]
    q, c, k_pe, kv_b = mla_inputs(h, w, i)
    q_nope, q_pe = q[..., :QK_NOPE_HEAD_DIM], q[..., QK_NOPE_HEAD_DIM:]
    w_uk, w_uv = kv_b[:, :QK_NOPE_HEAD_DIM, :], kv_b[:, QK_NOPE_HEAD_DIM:, :]  # [H, NOPE|V, R]
    q_latent = np.einsum("qhn,hnr->qhr", q_nope, w_uk)
    q_pe = rope_interleaved(q_pe, positions, scaling)
    k_pe = rope_interleaved(k_pe[:, None, :], positions, scaling)[:, 0, :]
    scores = (np.einsum("qhr,kr->hqk", q_latent, c) + np.einsum("qhd,kd->hqk", q_pe, k_pe)) \
        * softmax_scale(scaling)
    probs = causal_softmax(scores)
    o_latent = np.einsum("hqk,kr->qhr", probs, c)
    out = np.einsum("qhr,hvr->qhv", o_latent, w_uv).reshape(n_tokens, N_HEADS * V_HEAD_DIM)
    return out @ w[f"model.layers.{i}.self_attn.o_proj.weight"].T, scores


def forward(w, ids, scaling=None, absorbed=False):
    """(logits [len(ids), VOCAB], per-layer scores) for tokens at positions 0..len(ids)-1."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    attention = attention_absorbed if absorbed else attention_expanded
    positions = np.arange(len(ids))
    x = w["model.embed_tokens.weight"][ids]
    all_scores = []
    for i in range(N_LAYERS):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"])
        a, scores = attention(h, w, i, positions, scaling)
        all_scores.append(scores)
        x = x + a
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"])
        gate = h @ w[p + "mlp.gate_proj.weight"].T
        up = h @ w[p + "mlp.up_proj.weight"].T
        x = x + ((gate / (1.0 + np.exp(-gate))) * up) @ w[p + "mlp.down_proj.weight"].T
    return rms_norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T, all_scores


def sig6(a):
    return [[float(f"{v:.6g}") for v in row] for row in a]


def main():
    rng = np.random.default_rng(SEED)
    w = make_weights(rng)
    w_noq = no_qlora_weights(w, rng)
    write_hf("hf", w, hf_config())
    write_hf("hf-no-qlora", w_noq, hf_config(q_lora=False))
    write_hf("hf-yarn", w, hf_config(rope_scaling=YARN))
    write_config("hf-moe", hf_config(first_k_dense_replace=1))
    f32_path = os.path.join(OUT, "tiny-deepseek-f32.gguf")
    q_path = os.path.join(OUT, "tiny-deepseek-q.gguf")
    write_gguf(f32_path, w, current_layout=True, quantized=False)
    write_gguf(q_path, w_noq, current_layout=False, quantized=True)
    check_gguf_metadata(f32_path, current_layout=True, q_lora=True)
    check_gguf_metadata(q_path, current_layout=False, q_lora=False)
    f32_back = hf_weights_from_gguf(f32_path)
    assert sorted(f32_back) == sorted(w), "F32 GGUF holds other tensors than hf/"
    for k in w:
        assert np.array_equal(f32_back[k], w[k].astype(np.float64)), f"F32 GGUF: {k} differs"
    w_gguf_q = hf_weights_from_gguf(q_path)
    assert sorted(w_gguf_q) == sorted(w_noq), "Q GGUF holds other tensors than hf-no-qlora/"

    ids = rng.integers(0, VOCAB, N_GOLDEN_TOKENS)
    variants = {"hf_qlora": (w, None), "hf_no_qlora": (w_noq, None), "hf_yarn": (w, YARN),
                "gguf_q": (w_gguf_q, None)}
    logits = {}
    for name, (weights, scaling) in variants.items():
        logits[name], scores = forward(weights, ids, scaling)
        # Self-check: absorbed MLA with in-place interleaved RoPE gives the same scores and logits.
        logits_abs, scores_abs = forward(weights, ids, scaling, absorbed=True)
        d_scores = max(np.abs(np.where(np.isfinite(s), s - t, 0)).max()
                       for s, t in zip(scores, scores_abs))
        d_logits = np.abs(logits[name] - logits_abs).max()
        assert d_scores < 1e-9 and d_logits < 1e-9, (name, d_scores, d_logits)
        causal = np.tril(np.ones((N_GOLDEN_TOKENS, N_GOLDEN_TOKENS), dtype=bool))
        score_std = np.mean([s[:, causal].std() for s in scores])
        print(f"{name}: absorbed vs expanded max |d scores| {d_scores:.3g}, max |d logits| "
              f"{d_logits:.3g}; pre-softmax score std {score_std:.3f}; logit std per position "
              f"(mean) {logits[name].std(axis=-1).mean():.3f}, range "
              f"[{logits[name].min():.2f}, {logits[name].max():.2f}]")

    d_yarn = np.abs(logits["hf_yarn"] - logits["hf_qlora"]).max()
    d_noq = np.abs(logits["hf_no_qlora"] - logits["hf_qlora"]).max()
    assert d_yarn > 0.1 and d_noq > 0.1, (d_yarn, d_noq)
    print(f"max |hf_yarn - hf_qlora| {d_yarn:.4f}; max |hf_no_qlora - hf_qlora| {d_noq:.4f}")
    d_q = np.abs(logits["gguf_q"] - logits["hf_no_qlora"]).max()
    agree = (logits["gguf_q"].argmax(-1) == logits["hf_no_qlora"].argmax(-1)).mean()
    assert 0 < d_q < 0.5 and agree >= 0.9, (d_q, agree)
    print(f"max |gguf_q - hf_no_qlora| {d_q:.4f}; argmax agreement gguf_q vs hf_no_qlora "
          f"{agree:.3f}")

    golden = {
        "description": "logits of a float64 numpy forward (HF DeepSeek-V2 semantics, expanded MLA "
                       "attention) at positions 0..n-1 for token_ids; hf_qlora = hf/ (q_lora_rank "
                       "32), hf_no_qlora = hf-no-qlora/ (q_proj), hf_yarn = hf-yarn/ (the weights "
                       "of hf/, DeepSeek YaRN rope_scaling factor 4, mscale 1.0, mscale_all_dim "
                       "0.8), gguf_q = tiny-deepseek-q.gguf (the weights of hf-no-qlora/, Q8_0/"
                       "F16) as dequantized by gguf-py; tiny-deepseek-f32.gguf holds exactly the "
                       "weights of hf/, so its logits are hf_qlora; 6 significant digits",
        "token_ids": [int(i) for i in ids],
        "logits_shape": [N_GOLDEN_TOKENS, VOCAB],
        "logits": {name: sig6(l) for name, l in logits.items()},
    }
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
