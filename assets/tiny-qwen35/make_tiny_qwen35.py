#!/usr/bin/env python3
"""Writes kvrun's tiny random Qwen3.5 (hybrid: Gated DeltaNet + gated full attention) and its
references, with HF transformers' own modeling code (modeling_qwen3_5.py) as the independent
forward and llama.cpp's converter for the GGUFs.

    /path/to/venv/bin/python assets/tiny-qwen35/make_tiny_qwen35.py
    (torch on CPU, transformers 5.2x, numpy, gguf, safetensors, tokenizers; LLAMA_CPP: see
    ../hf-reference/tiny_hf.py)

Deterministic (seeded torch and numpy). Writes, next to this script:
  hf/                   Qwen3_5ForCausalLM.save_pretrained (f32 safetensors, config.json) and a
                        byte-level tokenizer: 4 layers (linear, linear, linear, full: Qwen3.5's
                        3-in-4 pattern), hidden 64; DeltaNet layers with 2 key heads and 4
                        value heads of 64 (GQA, as Qwen3.5's 16 / 32; llama.cpp wants key and
                        value heads of one size), a 4-tap conv; the full
                        layer with 4 query / 2 KV heads of 32, the output gate, Q/K norms and
                        partial RoPE (a quarter of each head, 8 channels); every norm weight
                        drawn away from its identity, A_log and dt_bias spread
  tiny-qwen35-f32.gguf  convert_hf_to_gguf.py hf/ --outtype f32 --no-mtp (GGUF arch qwen35)
  tiny-qwen35-q8_0.gguf convert_hf_to_gguf.py hf/ --outtype q8_0 --no-mtp
  golden.json           40 token ids and logits [40, 257] of transformers' forward in float64:
                        "hf_f32" (hf/), "gguf_q8_0" (the Q8_0 GGUF's weights as gguf-py
                        dequantizes them, the converter's changes undone — the 1 taken off the
                        zero-centred norms, A_log = log(−ssm_a), the value heads put back in
                        transformers' order — loaded into the same transformers model); and
                        "perplexity": of assets/text/alice-ch1-9.txt (128-token chunks, 4 of
                        them, llama-perplexity's convention) under both transformers forwards
                        and llama.cpp's llama-perplexity on both GGUFs
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf-reference"))
import tiny_hf  # noqa: E402

SEED = 3505
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def make_model(vocab):
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig
    config = Qwen3_5TextConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        linear_conv_kernel_dim=4, linear_key_head_dim=64, linear_value_head_dim=64,
        linear_num_key_heads=2, linear_num_value_heads=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000.0,
                         "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                         "mrope_interleaved": True},
        initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = Qwen3_5ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                # the gated norm multiplies by w: far from 1
                p.copy_(torch.empty_like(p).uniform_(0.3, 1.7))
            elif name.endswith("norm.weight"):
                # the zero-centred norms multiply by 1 + w: far from 0
                p.copy_(torch.empty_like(p).uniform_(-0.7, 0.7))
            elif name.endswith("dt_bias"):
                p.copy_(torch.empty_like(p).uniform_(-1.0, 1.0))
            elif name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(-1.0, 1.5))
    return model.float()


# GGUF base names of a layer's tensors (llama.cpp's qwen35) → HF module paths.
LAYER = {
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_qkv": "linear_attn.in_proj_qkv",
    "attn_gate": "linear_attn.in_proj_z", "ssm_beta": "linear_attn.in_proj_b",
    "ssm_alpha": "linear_attn.in_proj_a", "ssm_conv1d": "linear_attn.conv1d",
    "ssm_norm": "linear_attn.norm", "ssm_out": "linear_attn.out_proj",
}


def gguf_state(path, config):
    """The GGUF's tensors as transformers' state dict: the converter's changes undone."""
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    dk, dv = config.linear_key_head_dim, config.linear_value_head_dim
    per = nv // nk

    def untile(a, axis, head_dim):
        # the converter's _reorder_v_heads ([k, per, d] → [per, k, d] along axis), inverted
        a = np.moveaxis(a, axis, 0)
        shape = a.shape
        a = a.reshape(per, nk, head_dim, *shape[1:]).swapaxes(0, 1).reshape(shape)
        return np.moveaxis(a, 0, axis)

    state = {}
    for name, a in tiny_hf.gguf_arrays(path).items():
        if name in tiny_hf.GGUF_TO_HF:
            hf = tiny_hf.GGUF_TO_HF[name]
        else:
            _, layer, rest = name.split(".", 2)
            base = {"ssm_a": "A_log", "ssm_dt.bias": "dt_bias"}.get(rest)
            if base is not None:
                hf = f"model.layers.{layer}.linear_attn.{base}"
            else:
                base, suffix = rest.rsplit(".", 1)
                hf = f"model.layers.{layer}.{LAYER[base]}.{suffix}"
        if name.endswith("norm.weight") and not name.endswith("ssm_norm.weight"):
            a = a - 1.0
        if name.endswith("ssm_a"):
            a = np.log(-a)
        if nk != nv and (".ssm_" in name or ".attn_qkv" in name or ".attn_gate" in name):
            if name.endswith(("ssm_a", "ssm_dt.bias", "ssm_beta.weight", "ssm_alpha.weight")):
                a = untile(a, 0, 1)
            elif name.endswith("attn_gate.weight"):
                a = untile(a, 0, dv)
            elif name.endswith("ssm_out.weight"):
                a = untile(a, 1, dv)
            elif name.endswith(("attn_qkv.weight", "ssm_conv1d.weight")):
                qk = 2 * nk * dk
                a = np.concatenate([a[:qk], untile(a[qk:], 0, dv)], axis=0)
        if name.endswith("ssm_conv1d.weight"):
            a = a[:, None, :]
        state[hf] = torch.from_numpy(np.ascontiguousarray(a))
    return state


def build(here, name, seed, make_model, gguf_state, vocab_extra=0):
    """Writes hf/, NAME-f32.gguf, NAME-q8_0.gguf and golden.json of a Qwen3.5-family model
    (this script's, and ../tiny-qwen35moe's): `make_model(vocab)` builds the same seeded model
    every call, `gguf_state(path, config)` undoes the converter's changes; `vocab_extra` tokens
    beyond the byte-level vocabulary (a tokenizer class that adds its own)."""
    hf = os.path.join(here, "hf")
    os.makedirs(hf, exist_ok=True)
    vocab = tiny_hf.write_tokenizer(hf, CHAT_TEMPLATE) + vocab_extra
    make_model(vocab).save_pretrained(hf, safe_serialization=True)
    ids = np.random.default_rng(seed).integers(0, vocab, tiny_hf.N_GOLDEN_TOKENS)
    f32 = os.path.join(here, f"{name}-f32.gguf")
    q8 = os.path.join(here, f"{name}-q8_0.gguf")
    # --no-mtp: the config has no multi-token-prediction layers
    tiny_hf.convert(hf, f32, "f32", "qwen35", ["--no-mtp"])
    tiny_hf.convert(hf, q8, "q8_0", "qwen35", ["--no-mtp"])
    logits = {"hf_f32": tiny_hf.logits_f64(make_model(vocab), ids.tolist())}
    # the f32 GGUF read back must be hf/ exactly: the undoing below is then right
    f32_model = make_model(vocab).to(torch.float64)
    f32_state = gguf_state(f32, f32_model.config)
    for k, v in f32_model.state_dict().items():
        if k in f32_state:
            assert torch.allclose(v, f32_state[k].to(v.dtype), atol=1e-6), k
    q_model = make_model(vocab).to(torch.float64)
    missing, unexpected = q_model.load_state_dict(gguf_state(q8, q_model.config), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    q_model.tie_weights()
    logits["gguf_q8_0"] = tiny_hf.logits_f64(q_model, ids.tolist())
    text = tiny_hf.text_ids(hf)
    ppl = {
        "text": "assets/text/alice-ch1-9.txt", "ctx": tiny_hf.PPL_CTX,
        "chunks": tiny_hf.PPL_CHUNKS,
        "transformers_f64": {"hf_f32": tiny_hf.perplexity_f64(make_model(vocab), text),
                             "gguf_q8_0": tiny_hf.perplexity_f64(q_model, text)},
        "llama_cpp": {os.path.basename(f): tiny_hf.llama_perplexity(f) for f in (f32, q8)},
    }
    tiny_hf.write_golden(os.path.join(here, "golden.json"), ids, logits, {"perplexity": ppl})
    print("wrote", hf, f32, q8, "golden.json", ppl)


def main():
    build(HERE, "tiny-qwen35", SEED, make_model, gguf_state)


if __name__ == "__main__":
    main()
