#!/usr/bin/env python3
"""Writes kvrun's tiny random gpt-oss and its references, with HF transformers' own modeling
code (modeling_gpt_oss.py) as the independent forward and llama.cpp's converter for the GGUFs.

    /path/to/venv/bin/python assets/tiny-gpt-oss/make_tiny_gpt_oss.py
    (torch on CPU, transformers 5.2x, numpy, gguf, safetensors, tokenizers; LLAMA_CPP: see
    ../hf-reference/tiny_hf.py)

Deterministic (seeded torch and numpy). Writes, next to this script:
  hf/                      GptOssForCausalLM.save_pretrained (f32 safetensors) and a byte-level
                           tokenizer: 4 layers alternating sliding (window 16) and full
                           attention, 8 query / 2 KV heads of 32 with q/k/v/o biases and
                           attention sinks (drawn N(0, 1): some heads give the sink real
                           weight), YaRN (factor 4 over 64 positions, beta_fast 32, beta_slow 1,
                           truncate false, as gpt-oss), every MLP 16 experts of 32 channels, 4 a
                           token (softmax over the top 4 router logits, router bias), expert
                           biases, the clamped SwiGLU (alpha 1.702, limit 7)
  tiny-gpt-oss-f32.gguf    convert_hf_to_gguf.py hf/ --outtype f32 (GGUF arch gpt-oss)
  tiny-gpt-oss-q8_0.gguf   convert_hf_to_gguf.py hf/ --outtype q8_0
  tiny-gpt-oss-mxfp4.gguf  the f32 GGUF with the experts' gate, up and down weights quantized to
                           MXFP4 by gguf-py (as the published gpt-oss GGUFs hold them; the
                           converter writes MXFP4 only from MXFP4 checkpoints)
  hf-mxfp4/                hf/ as the published gpt-oss checkpoints hold their experts: MXFP4
                           `*_blocks` / `*_scales` byte tensors (transformers' layout, element
                           pairs in a byte) carrying exactly the MXFP4 GGUF's blocks, and
                           `quantization_config` mxfp4; checked here against transformers'
                           own `convert_moe_packed_tensors` (its dequantization equals
                           gguf-py's of the MXFP4 GGUF) and llama.cpp's converter (which
                           repacks it to the MXFP4 GGUF's expert bytes), so its references are
                           the MXFP4 GGUF's ("gguf_mxfp4")
  golden.json              40 token ids and logits [40, 257] of transformers' float64 forward
                           for hf/ ("hf_f32"), the Q8_0 GGUF's dequantized weights
                           ("gguf_q8_0") and the MXFP4 GGUF's ("gguf_mxfp4"), perplexities of
                           assets/text/alice-ch1-9.txt under transformers and llama.cpp's
                           llama-perplexity on the three GGUFs; under "f16_kv" the same with K
                           and V rounded to f16, as kvrun's default KV cache stores them

llama.cpp's gpt-oss differs from transformers here in one known way: its YaRN always truncates
the correction range (ggml's rope_yarn_corr_dims floors and ceils), where gpt-oss's config says
truncate false. With this model's short original context (64) that moves the perplexity by 1 %:
llama.cpp's 353.78 on the f32 GGUF matches transformers run with truncate true (353.52), not the
model as defined (357.15). (Measured 2026-12-07; the published gpt-oss's original context of
4096 moves it far less.) llama.cpp also computes MXFP4 products with its activations rounded
to 8 bits (Q8_0), which moves this tiny random model's perplexity more than a trained one's.
"""
import contextlib
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "hf-reference"))
import tiny_hf  # noqa: E402

SEED = 4306
EXPERTS, USED, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 16, 4, 32, 4, 8, 2, 32
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|start|>' + message['role'] + '<|message|>' + message['content'] + '<|end|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start|>assistant' }}{% endif %}"
)

# GGUF base names of a layer's tensors that map one to one → HF module paths.
LAYER = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "attn_sinks": "self_attn.sinks", "post_attention_norm": "post_attention_layernorm",
    "ffn_gate_inp": "mlp.router",
}


def make_model(vocab):
    from transformers import GptOssConfig, GptOssForCausalLM
    config = GptOssConfig(
        vocab_size=vocab, hidden_size=64, intermediate_size=FFN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
        num_local_experts=EXPERTS, num_experts_per_tok=USED, sliding_window=16,
        layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2),
        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150_000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False},
        initializer_range=0.1, bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    torch.manual_seed(SEED)
    model = GptOssForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(torch.empty_like(p).uniform_(0.3, 1.7))
            elif name.endswith("mlp.router.weight"):
                p.copy_(torch.empty_like(p).normal_(0.0, 1.0))
            elif name.endswith("sinks"):
                p.copy_(torch.empty_like(p).normal_(0.0, 1.0))
            elif "experts" in name:
                p.copy_(torch.empty_like(p).normal_(0.0, 0.2))
            elif name.endswith("bias"):
                p.copy_(torch.empty_like(p).normal_(0.0, 0.1))
    return model.float()


def gguf_state(arrays):
    """A GGUF's (dequantized) tensors as GptOssForCausalLM's parameters: the stacked experts'
    gate and up interleaved back into gate_up_proj [E, hidden, 2·ffn] (transposed), down
    [E, hidden, ffn] transposed to down_proj [E, ffn, hidden], and their biases."""
    state = {}
    for k, v in arrays.items():
        if "_exps." in k:
            continue
        # the converter names the sinks parameter as a weight
        name = tiny_hf.hf_name(k, LAYER)
        state[name.removesuffix(".weight") if "attn_sinks" in k else name] = v
    for layer in range(LAYERS):
        b = f"blk.{layer}"
        prefix = f"model.layers.{layer}.mlp.experts"
        g, u = arrays[f"{b}.ffn_gate_exps.weight"], arrays[f"{b}.ffn_up_exps.weight"]
        gate_up = np.empty((EXPERTS, 2 * FFN, g.shape[2]))
        gate_up[:, 0::2], gate_up[:, 1::2] = g, u
        state[f"{prefix}.gate_up_proj"] = gate_up.transpose(0, 2, 1)
        gb, ub = arrays[f"{b}.ffn_gate_exps.bias"], arrays[f"{b}.ffn_up_exps.bias"]
        gate_up_bias = np.empty((EXPERTS, 2 * FFN))
        gate_up_bias[:, 0::2], gate_up_bias[:, 1::2] = gb, ub
        state[f"{prefix}.gate_up_proj_bias"] = gate_up_bias
        state[f"{prefix}.down_proj"] = arrays[f"{b}.ffn_down_exps.weight"].transpose(0, 2, 1)
        state[f"{prefix}.down_proj_bias"] = arrays[f"{b}.ffn_down_exps.bias"]
    return state


def write_mxfp4(src, dst):
    """`src` (the f32 GGUF) with every ffn_*_exps.weight quantized to MXFP4 by gguf-py."""
    import gguf
    from gguf.quants import quantize
    reader = gguf.GGUFReader(src)
    arch = "gpt-oss"
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(field.name, field.contents(), vtype, sub_type=field.types[-1])
        else:
            writer.add_key_value(field.name, field.contents(), vtype)
    for t in reader.tensors:
        data = np.asarray(t.data)
        shape = [int(x) for x in reversed(t.shape.tolist())]  # numpy order
        if t.name.endswith("_exps.weight"):
            q = quantize(data.reshape(shape).astype(np.float32), gguf.GGMLQuantizationType.MXFP4)
            writer.add_tensor(t.name, q, raw_dtype=gguf.GGMLQuantizationType.MXFP4)
        else:
            writer.add_tensor(t.name, data.reshape(shape))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_blocks_to_hf(q, rows, cols):
    """ggml MXFP4 bytes [.., rows, cols / 32 · 17] (scale, then byte j = elements j | j + 16)
    → transformers' (blocks [.., rows, cols / 32, 16] with byte j = elements 2j | 2j + 1,
    scales [.., rows, cols / 32])."""
    q = np.asarray(q, dtype=np.uint8).reshape(-1, rows, cols // 32, 17)
    scales = q[..., 0]
    qs = q[..., 1:]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1)  # elements 0..31
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(blocks), np.ascontiguousarray(scales)


def write_hf_mxfp4(mx, hf_dir, out_dir):
    """hf_dir's checkpoint with the experts of the MXFP4 GGUF `mx` as MXFP4 byte tensors (see
    the top), checked against transformers' and llama.cpp's own readings of that layout."""
    import shutil

    import gguf
    from gguf.quants import dequantize
    from safetensors.numpy import load_file, save_file
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    os.makedirs(out_dir, exist_ok=True)
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"]:
        shutil.copy(os.path.join(hf_dir, name), os.path.join(out_dir, name))
    with open(os.path.join(hf_dir, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"],
    }
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    state = load_file(os.path.join(hf_dir, "model.safetensors"))
    reader = gguf.GGUFReader(mx)
    tensors = {t.name: t for t in reader.tensors}
    hidden = config["hidden_size"]
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}.mlp.experts"
        exps = {}
        for part, cols in [("gate", hidden), ("up", hidden), ("down", FFN)]:
            t = tensors[f"blk.{layer}.ffn_{part}_exps.weight"]
            assert t.tensor_type == gguf.GGMLQuantizationType.MXFP4
            rows = FFN if part != "down" else hidden
            raw = np.asarray(t.data, dtype=np.uint8)
            exps[part] = (raw, rows, cols)
        gb, gs = gguf_blocks_to_hf(*exps["gate"])
        ub, us = gguf_blocks_to_hf(*exps["up"])
        blocks = np.empty((EXPERTS, 2 * FFN) + gb.shape[2:], np.uint8)
        scales = np.empty((EXPERTS, 2 * FFN) + gs.shape[2:], np.uint8)
        blocks[:, 0::2], blocks[:, 1::2] = gb, ub
        scales[:, 0::2], scales[:, 1::2] = gs, us
        db, ds = gguf_blocks_to_hf(*exps["down"])
        del state[f"{prefix}.gate_up_proj"], state[f"{prefix}.down_proj"]
        state[f"{prefix}.gate_up_proj_blocks"], state[f"{prefix}.gate_up_proj_scales"] = blocks, scales
        state[f"{prefix}.down_proj_blocks"], state[f"{prefix}.down_proj_scales"] = db, ds
        # transformers' dequantization of these bytes is gguf-py's of the GGUF's, exactly
        for (b, sc), parts in [((blocks, scales), ["gate", "up"]), ((db, ds), ["down"])]:
            hf = convert_moe_packed_tensors(torch.from_numpy(b), torch.from_numpy(sc),
                                            dtype=torch.float32).numpy()  # [E, in, out]
            want = [dequantize(exps[p][0], gguf.GGMLQuantizationType.MXFP4).reshape(
                EXPERTS, exps[p][1], exps[p][2]) for p in parts]
            if len(want) == 2:
                rows = np.empty((EXPERTS, 2 * FFN, hidden), np.float32)
                rows[:, 0::2], rows[:, 1::2] = want
            else:
                rows = want[0]
            assert np.array_equal(hf, rows.transpose(0, 2, 1)), (layer, parts)
    save_file(state, os.path.join(out_dir, "model.safetensors"))
    # llama.cpp's converter repacks the checkpoint into the MXFP4 GGUF's expert bytes
    converted = os.path.join(out_dir, "..", "hf-mxfp4-converted.gguf.tmp")
    tiny_hf.convert(out_dir, converted, "f32", "qwen2")
    try:
        back = {t.name: t for t in gguf.GGUFReader(converted).tensors}
        for name, t in tensors.items():
            if name.endswith("_exps.weight"):
                assert back[name].tensor_type == gguf.GGMLQuantizationType.MXFP4, name
                assert np.array_equal(np.asarray(back[name].data), np.asarray(t.data)), name
    finally:
        os.remove(converted)


@contextlib.contextmanager
def f16_kv():
    """What kvrun's (and llama.cpp's) default f16 cache holds rounded to f16: K after RoPE, V."""
    import transformers.models.gpt_oss.modeling_gpt_oss as m
    rotary = m.apply_rotary_pos_emb
    forward = m.eager_attention_forward

    def rounded_rotary(*args, **kwargs):
        q, k = rotary(*args, **kwargs)
        return q, k.half().to(k.dtype)

    def rounded_forward(module, query, key, value, *args, **kwargs):
        return forward(module, query, key, value.half().to(value.dtype), *args, **kwargs)

    m.apply_rotary_pos_emb = rounded_rotary
    m.eager_attention_forward = rounded_forward
    try:
        yield
    finally:
        m.apply_rotary_pos_emb = rotary
        m.eager_attention_forward = forward


def main():
    if sys.argv[1:] == ["--hf-mxfp4"]:
        # hf-mxfp4/ alone, from the committed hf/ and MXFP4 GGUF
        mx = os.path.join(HERE, "tiny-gpt-oss-mxfp4.gguf")
        write_hf_mxfp4(mx, os.path.join(HERE, "hf"), os.path.join(HERE, "hf-mxfp4"))
        return
    vocab = tiny_hf.build(HERE, "tiny-gpt-oss", SEED, make_model, CHAT_TEMPLATE, LAYER, "qwen2",
                          gguf_state=gguf_state)
    f32 = os.path.join(HERE, "tiny-gpt-oss-f32.gguf")
    mx = os.path.join(HERE, "tiny-gpt-oss-mxfp4.gguf")
    write_mxfp4(f32, mx)
    write_hf_mxfp4(mx, os.path.join(HERE, "hf"), os.path.join(HERE, "hf-mxfp4"))
    path = os.path.join(HERE, "golden.json")
    golden = tiny_hf.read_golden(path)
    ids = golden["token_ids"]
    mx_model = make_model(vocab).to(torch.float64)
    state = {k: torch.from_numpy(np.ascontiguousarray(v))
             for k, v in gguf_state(tiny_hf.gguf_arrays(mx)).items()}
    missing, unexpected = mx_model.load_state_dict(state, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    text = tiny_hf.text_ids(os.path.join(HERE, "hf"))
    golden["logits"]["gguf_mxfp4"] = tiny_hf.logits_f64(mx_model, ids)
    golden["perplexity"]["transformers_f64"]["gguf_mxfp4"] = tiny_hf.perplexity_f64(mx_model, text)
    golden["perplexity"]["llama_cpp"][os.path.basename(mx)] = tiny_hf.llama_perplexity(mx)
    logits = {k: np.asarray(v) for k, v in golden["logits"].items()}
    tiny_hf.write_golden(path, ids, logits, {"perplexity": golden["perplexity"]})
    tiny_hf.add_f16_kv_references(HERE, "tiny-gpt-oss", make_model, gguf_state, f16_kv)
    golden = tiny_hf.read_golden(path)
    with f16_kv():
        golden["f16_kv"]["logits"]["gguf_mxfp4"] = [
            [round(float(x), 6) for x in row] for row in tiny_hf.logits_f64(mx_model, ids)]
        golden["f16_kv"]["perplexity"]["gguf_mxfp4"] = tiny_hf.perplexity_f64(mx_model, text)
    with open(path, "w") as f:
        json.dump(golden, f)
        f.write("\n")
    print("wrote", mx)


if __name__ == "__main__":
    main()
