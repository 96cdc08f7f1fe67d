"""Writes the committed seed inputs under fuzz/corpus/<target>/seed-* (small on purpose).

GGUF seeds come from gguf-py (an independent writer); the other formats are spelled out here.
Run from the repository root: python fuzz/make_seeds.py
"""

import json
import pathlib
import struct

import gguf
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
CORPUS = ROOT / "fuzz" / "corpus"


def write(target, name, data):
    path = CORPUS / target / f"seed-{name}"
    path.write_bytes(data)
    print(path.relative_to(ROOT), len(data))


def gguf_seed(name, model, pre, tokens, merges, tensors):
    path = CORPUS / "gguf" / f"seed-{name}"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.embedding_length", 8)
    w.add_uint32("llama.feed_forward_length", 16)
    w.add_uint32("llama.block_count", 1)
    w.add_uint32("llama.attention.head_count", 2)
    w.add_uint32("llama.attention.head_count_kv", 1)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("llama.context_length", 64)
    w.add_string("tokenizer.ggml.model", model)
    if pre:
        w.add_string("tokenizer.ggml.pre", pre)
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", [3] + [1] * (len(tokens) - 1))
    w.add_array("tokenizer.ggml.scores", [-float(i) for i in range(len(tokens))])
    if merges:
        w.add_array("tokenizer.ggml.merges", merges)
    w.add_uint32("tokenizer.ggml.bos_token_id", 0)
    w.add_uint32("tokenizer.ggml.eos_token_id", 0)
    w.add_string("tokenizer.chat_template", "{% for m in messages %}{{ m.content }}{% endfor %}")
    for tname, (arr, qtype) in tensors.items():
        if qtype is None:
            w.add_tensor(tname, arr)
        else:
            q = gguf.quantize(arr, qtype)
            w.add_tensor(tname, q, raw_shape=q.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(path.relative_to(ROOT), path.stat().st_size)


def safetensors(tensors):
    header, blobs, off = {}, [], 0
    for name, arr, dtype in tensors:
        raw = arr.tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def main():
    rng = np.random.default_rng(0)
    bpe_tokens = ["<|endoftext|>", "H", "e", "l", "o", "Ġ", "w", "He", "ll", "Ġw", "1", "2"]
    gguf_seed("bpe-f32-q8", "gpt2", "smollm", bpe_tokens, ["H e", "l l", "Ġ w"], {
        "token_embd.weight": (rng.standard_normal((12, 8), dtype=np.float32), None),
        "blk.0.attn_q.weight": (rng.standard_normal((8, 32), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0),
    })
    spm_tokens = ["<unk>", "<s>", "</s>", "▁", "▁H", "e", "l", "o", "<0x0A>"]
    gguf_seed("spm-q4", "llama", None, spm_tokens, None, {
        "output_norm.weight": (np.ones(8, dtype=np.float32), None),
        "blk.0.ffn_down.weight": (rng.standard_normal((2, 32), dtype=np.float32), gguf.GGMLQuantizationType.Q4_0),
    })

    config = (ROOT / "assets/tiny-llama/hf/config.json").read_bytes()
    weights = safetensors([
        ("model.embed_tokens.weight", rng.standard_normal((4, 8), dtype=np.float32), "F32"),
        ("model.norm.weight", np.ones(8, dtype=np.float16), "F16"),
        ("lm_head.weight", np.zeros((2, 8), dtype=np.uint16), "BF16"),
    ])
    write("hf_dir", "tiny-config", struct.pack("<H", len(config)) + config + weights)
    write("hf_dir", "empty-weights", struct.pack("<H", len(config)) + config + safetensors([]))

    # [model][pre][flags][bos][eos] tokens \x01 merges \x01 types \x01 text
    bpe = "\n".join(bpe_tokens) + "\x01" + "H e\nl l\nĠ w" + "\x01" + "\x03" + "\x01Hello world 12"
    write("gguf_tokenizer", "bpe", bytes([0, 1, 0b111, 0, 0]) + bpe.encode())
    spm = "\n".join(spm_tokens) + "\x01\x01" + "\x02\x03\x03" + "\x01Hello\nworld"
    write("gguf_tokenizer", "spm", bytes([1, 0, 0b10111, 1, 2]) + spm.encode())

    msgs = "\0".join(["system\x1fBe brief.", "Hi there", "Hello!", "What is 2+2?"])
    for name in ["smollm2", "layout"]:
        src = (ROOT / f"assets/fixtures/chat/{name}.jinja").read_text()
        write("chat_template", name, (src + "\0" + msgs).encode())
    loop = "{% for m in messages %}{% if loop.index0 is even %}{{ m.role|upper }}{% endif %}" \
           "{{ m.content|trim }}{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    write("chat_template", "loop", (loop + "\0" + msgs).encode())


if __name__ == "__main__":
    main()
