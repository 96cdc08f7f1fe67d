#!/usr/bin/env python3
"""Write a Llama-architecture GGUF of a named shape with random (valid) quantized weights.

For timing only: decode and prefill cost does not depend on the weights' values, so a machine
that cannot be sent a multi-GB model (scripts/gpu-check.sh on a lent GPU) can build one of the
same shape and format where it runs. The tokenizer (every `tokenizer.*` key) is copied from
`--vocab`, any GGUF that has one (llama.cpp's vocab-only files under
assets/models/llama-cpp-vocabs/ do); the vocabulary size follows from it.

    scripts/synth-gguf.py --shape llama-8b --type q4_0 \\
        --vocab assets/models/llama-cpp-vocabs/ggml-vocab-llama-bpe.gguf OUT.gguf
    scripts/synth-gguf.py --vocab-only --vocab MODEL.gguf VOCAB.gguf   (the tokenizer alone)

Needs numpy and gguf-py (`pip install gguf`). Quantized blocks get a small positive scale
(and a small negative minimum for Q4_1) and random quants, so every weight is finite and the
activations stay finite; norm weights are 1. The output is garbage text, at full speed.
"""
import argparse
import sys

import numpy as np
from gguf import GGMLQuantizationType as Q, GGUFReader, GGUFValueType, GGUFWriter

# name: (hidden, layers, heads, kv heads, ffn, rope theta, tied embeddings)
SHAPES = {
    "smollm2-135m": (576, 30, 9, 3, 1536, 100000.0, True),
    "llama-1b": (2048, 16, 32, 8, 8192, 500000.0, True),
    "llama-8b": (4096, 32, 32, 8, 14336, 500000.0, False),
}
# type: (ggml type, bytes per block of 32 weights)
TYPES = {"q4_0": (Q.Q4_0, 18), "q4_1": (Q.Q4_1, 20), "q8_0": (Q.Q8_0, 34)}


POOL = 1 << 16  # distinct random blocks per type, repeated to fill a tensor


def block_pool(rng, qtype):
    """`POOL` random valid blocks of `qtype` as uint8 (POOL, bytes per block)."""
    _, size = TYPES[qtype]
    data = rng.integers(0, 256, size=(POOL, size), dtype=np.uint8)
    # d: small enough that a dot product over a few thousand weights stays near 1.
    d = (rng.random(POOL, dtype=np.float32) * 2e-3 + 1e-4).astype(np.float16)
    data[:, 0:2] = d.view(np.uint8).reshape(POOL, 2)
    if qtype == "q4_1":
        m = (-8 * d.astype(np.float32)).astype(np.float16)  # centres the 0..15 quants
        data[:, 2:4] = m.view(np.uint8).reshape(POOL, 2)
    return data


def blocks(pool, rows, cols, qtype):
    """`rows` rows of `cols` weights as uint8 (rows, bytes), the pool's blocks repeated."""
    ggml, size = TYPES[qtype]
    if cols % 32:
        sys.exit(f"a row of {cols} weights is not whole blocks of 32")
    nb = rows * (cols // 32)
    return np.resize(pool, (nb, size)).reshape(rows, (cols // 32) * size), ggml


def copy_tokenizer(src, w):
    """Copies every `tokenizer.*` key of the GGUF at `src` into writer `w`; the vocab size."""
    n_vocab = None
    for field in GGUFReader(src).fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        if vtype == GGUFValueType.ARRAY:
            items = field.contents()
            w.add_array(field.name, items)
            if field.name == "tokenizer.ggml.tokens":
                n_vocab = len(items)
        else:
            w.add_key_value(field.name, field.contents(), vtype)
    if n_vocab is None:
        sys.exit(f"{src} has no tokenizer.ggml.tokens")
    return n_vocab


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES))
    p.add_argument("--type", choices=sorted(TYPES), default="q4_0")
    p.add_argument("--vocab", required=True, help="a GGUF whose tokenizer.* keys are copied")
    p.add_argument("--vocab-only", action="store_true",
                   help="write only the tokenizer (a small file to carry instead of a model)")
    p.add_argument("--context-length", type=int, default=16384)
    p.add_argument("out")
    a = p.parse_args()
    if a.vocab_only:
        w = GGUFWriter(a.out, "llama")
        n_vocab = copy_tokenizer(a.vocab, w)
        finish(w)
        print(f"{a.out}: the tokenizer of {a.vocab} ({n_vocab} tokens)")
        return
    if a.shape is None:
        p.error("--shape is required (unless --vocab-only)")
    hidden, layers, heads, kv_heads, ffn, theta, tied = SHAPES[a.shape]
    head_dim = hidden // heads

    w = GGUFWriter(a.out, "llama")
    w.add_name(f"synthetic {a.shape} {a.type} (random weights, timing only)")
    w.add_block_count(layers)
    w.add_context_length(a.context_length)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(theta)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(head_dim)
    n_vocab = copy_tokenizer(a.vocab, w)
    w.add_vocab_size(n_vocab)

    pool = block_pool(np.random.default_rng(0), a.type)
    ones = np.ones(hidden, dtype=np.float32)

    def mat(name, rows, cols):
        data, ggml = blocks(pool, rows, cols, a.type)
        w.add_tensor(name, data, raw_dtype=ggml)

    mat("token_embd.weight", n_vocab, hidden)
    for i in range(layers):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", ones)
        mat(b + "attn_q.weight", heads * head_dim, hidden)
        mat(b + "attn_k.weight", kv_heads * head_dim, hidden)
        mat(b + "attn_v.weight", kv_heads * head_dim, hidden)
        mat(b + "attn_output.weight", hidden, heads * head_dim)
        w.add_tensor(b + "ffn_norm.weight", ones)
        mat(b + "ffn_gate.weight", ffn, hidden)
        mat(b + "ffn_up.weight", ffn, hidden)
        mat(b + "ffn_down.weight", hidden, ffn)
    w.add_tensor("output_norm.weight", ones)
    if not tied:
        mat("output.weight", n_vocab, hidden)

    finish(w)
    print(f"{a.out}: {a.shape} {a.type}, vocab {n_vocab}, {layers} layers")


if __name__ == "__main__":
    main()
