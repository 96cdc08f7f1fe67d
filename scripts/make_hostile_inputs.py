#!/usr/bin/env python3
"""Writes hostile model files for kvrun: one file (or HF directory) per case, plus manifest.json.

    pip install numpy gguf          # tested: numpy 2.4, gguf 0.19.0
    python3 scripts/make_hostile_inputs.py /tmp/kvrun-hostile     # ~270 MB, a few seconds
    python3 scripts/run_hostile_inputs.py /tmp/kvrun-hostile      # runs target/release/kvrun

Every case starts from the repo's own tiny model (assets/tiny-llama/tiny-llama-q.gguf, written by
assets/tiny-llama/make_tiny_llama.py): its metadata and tensors are copied as they are (quantized
bytes untouched) and exactly one thing is perturbed, so the parse succeeds and the failure lands
one layer deeper (config, shapes, GPU buffers, tokenizer, chat template). HF cases copy
assets/tiny-llama/hf/ and change config.json or model.safetensors. Byte-level cases (overlapping
tensor data, huge metadata arrays, truncation) patch a file gguf-py wrote, at offsets read back
with gguf-py's GGUFReader.

manifest.json: {"cases": [...], "flag_cases": [...]} where each entry has
  id           unique name of the run
  file         path relative to the output folder ("" for flag cases)
  class        control (must pass), or the issue's class: a (absurd sizes), b (flags),
               c (tokenizer vocab > embedding), d (chat template), e (metadata RAM),
               f (silently wrong), g (messages), plus missing-tensor, wrong-shape, truncated,
               not-gguf, path, hf-config
  args         kvrun arguments; {FILE} = the case's file, {OUT} = the output folder,
               {TEXT} = assets/text/alice-ch1-9.txt, {REAL} = the SmolLM2 model; run from the
               repo root
  expect_any   a correct error contains at least one of these (case-insensitive; matched with
               the case's own path taken out, so a file name never matches by accident)
  reject_any   ... and none of these (the misleading wording the issue reports)
  names        what the error must name: "file" (the case's file name) or a flag such as "-c"
  accept_success  true where running normally (exit 0, within the limits) is also correct
  why          what the case probes and what goes wrong today, as the issue reports it

The bar every run is judged by (scripts/run_hostile_inputs.py): exit non-zero with a one-line
error naming the file or the flag, in < 10 s and < 1 GB RSS, never a panic, abort or hang.
"""
import json
import os
import shutil
import struct
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as VT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BASE_GGUF = os.path.join(REPO, "assets", "tiny-llama", "tiny-llama-q.gguf")
BASE_HF = os.path.join(REPO, "assets", "tiny-llama", "hf")
ARCH = "llama"
MIB = 1 << 20

GEN = ["generate", "-m", "{FILE}", "-p", "hi", "-n", "2"]
GEN_RAW = GEN + ["--raw"]
PPL = ["perplexity", "-m", "{FILE}", "-f", "{TEXT}", "-c", "64", "--chunks", "1"]
PLAN = ["plan", "-m", "{FILE}"]


class Base:
    """The tiny model's metadata (in file order) and tensors (raw bytes, file order)."""

    def __init__(self, path):
        r = gguf.GGUFReader(path)
        self.arch = r.fields["general.architecture"].contents()
        self.kv = []  # (key, value, type, sub_type)
        for f in r.fields.values():
            if f.name.startswith("GGUF.") or f.name == "general.architecture":
                continue
            vtype = f.types[0]
            sub = f.types[-1] if vtype == VT.ARRAY else None
            self.kv.append((f.name, f.contents(), vtype, sub))
        # (name, data, type): data as GGUFReader gives it (uint8 rows for quantized types),
        # copied so the reader's map can close.
        self.tensors = [(t.name, np.array(t.data), t.tensor_type) for t in r.tensors]

    def tensor(self, name):
        return next(t for t in self.tensors if t[0] == name)


def write_gguf(base, path, set_kv=None, drop_kv=(), add_kv=(), tensors=None):
    """The base model with `set_kv` {key: (value, type)} changed, `drop_kv` removed, `add_kv`
    [(key, value, type, sub_type)] appended and `tensors` [(name, data, type)] in place of the
    base's (default: the base's)."""
    set_kv = dict(set_kv or {})
    w = gguf.GGUFWriter(path, base.arch)
    for key, value, vtype, sub in base.kv:
        if key in drop_kv:
            continue
        if key in set_kv:
            value, vtype = set_kv.pop(key)
        w.add_key_value(key, value, vtype, sub_type=sub)
    for key, (value, vtype) in set_kv.items():
        w.add_key_value(key, value, vtype)
    for key, value, vtype, sub in add_kv:
        w.add_key_value(key, value, vtype, sub_type=sub)
    for name, data, ttype in base.tensors if tensors is None else tensors:
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=ttype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def replace_tensor(base, name, data, ttype):
    return [(n, data, ttype) if n == name else (n, d, t) for n, d, t in base.tensors]


def without_tensor(base, name):
    return [t for t in base.tensors if t[0] != name]


# --- byte-level patches of a file gguf-py wrote ---------------------------------------------

def tensor_offset_pos(path, name):
    """(file position of the tensor info's u64 data offset, its value)."""
    r = gguf.GGUFReader(path)
    t = next(t for t in r.tensors if t.name == name)
    pos = t.field.offset + sum(p.nbytes for p in t.field.parts[:-1])
    return pos, int(t.field.parts[-1][0])


def patch_u64(path, pos, value):
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(struct.pack("<Q", value))


def grow_array(path, key, elem_len, extra_elems):
    """Makes the metadata array `key` (written with one element of `elem_len` encoded bytes,
    all zero for the added ones) `extra_elems` elements longer, streaming. The inserted byte
    count must be a multiple of the alignment (32) so the data section stays aligned."""
    extra = extra_elems * elem_len
    assert extra % 32 == 0, "keep the data section aligned"
    r = gguf.GGUFReader(path)
    f = r.fields[key]
    count_pos = f.offset + sum(p.nbytes for p in f.parts[:4])  # key len, key, type, elem type
    count = int(f.parts[4][0])
    insert_at = count_pos + 8 + count * elem_len
    del r
    tmp = path + ".tmp"
    with open(path, "rb") as src, open(tmp, "wb") as dst:
        dst.write(src.read(count_pos))
        dst.write(struct.pack("<Q", count + extra_elems))
        src.seek(count_pos + 8)
        dst.write(src.read(insert_at - count_pos - 8))
        zeros = bytes(MIB)
        left = extra
        while left:
            n = min(left, MIB)
            dst.write(zeros[:n])
            left -= n
        shutil.copyfileobj(src, dst)
    os.replace(tmp, path)


# --- the cases ------------------------------------------------------------------------------

def entry(cid, file, cls, args, expect_any, why, names="file", accept_success=False,
          reject_any=(), asked_mib=0):
    """asked_mib: memory the flags legitimately ask for (a KV pool the user sized); the RSS bar
    of the case is raised by it, and the time bar by a second per 256 MiB of it, since on a CPU
    adapter device memory is host memory that has to be zero-filled."""
    return {"id": cid, "file": file, "class": cls, "args": args, "expect_any": expect_any,
            "reject_any": list(reject_any), "names": names, "accept_success": accept_success,
            "asked_mib": asked_mib, "why": why}


def control(base, out):
    """The base model, unchanged (byte-identical to tiny-llama-q.gguf): must run."""
    name = "control_tiny.gguf"
    write_gguf(base, os.path.join(out, name))
    return [entry(f"control_tiny:{a[0]}", name, "control", a, [], "unchanged copy: must pass",
                  accept_success=True) for a in (GEN, PPL, PLAN)]


def absurd_sizes(base, out):
    cases = []
    u32, u64 = VT.UINT32, VT.UINT64
    specs = [
        ("block_count_1e6.gguf", {"llama.block_count": (1_000_000, u32)},
         ["block_count", "blk.2"], [GEN, PLAN],
         "1e6 layers, tensors for 2: the KV pool (1e6 layers) is allocated before the weights"),
        ("block_count_u32max.gguf", {"llama.block_count": (2**32 - 1, u32)},
         ["block_count", "blk.2"], [GEN, PLAN], "u32::MAX layers: KV byte math, per-layer buffers"),
        ("ffn_2e30.gguf", {"llama.feed_forward_length": (2**30, u32)},
         ["feed_forward_length", "ffn_gate", "intermediate"], [GEN],
         "FFN width 2^30: gate_up activation 512 x 2^31 x 4 bytes allocated before shape checks"),
        ("embd_2e24.gguf", {"llama.embedding_length": (2**24, u32),
                            "llama.attention.key_length": (16, u32)},
         ["embedding_length", "token_embd", "hidden"], [GEN],
         "hidden size 2^24 (head_dim pinned at 16 by key_length so the RoPE check passes)"),
        ("vocab_2e31.gguf", {"llama.vocab_size": (2**31, u32)},
         ["vocab_size", "token_embd", "vocab"], [GEN, PLAN],
         "vocab 2^31 with 256 real rows: the 8 GiB logits buffer comes before the shape check"),
        ("vocab_2e62_u64.gguf", {"llama.vocab_size": (2**62, u64)},
         ["vocab_size", "token_embd", "vocab"], [GEN, PLAN],
         "vocab 2^62: rows*vocab*4 wraps to 0 in usize (release build), plan's arithmetic wraps"),
    ]
    for name, set_kv, expect, cmds, why in specs:
        write_gguf(base, os.path.join(out, name), set_kv=set_kv)
        for args in cmds:
            cid = f"{name[:-5]}:{args[0]}"
            cases.append(entry(cid, name, "a", args, expect, why))
    return cases


def missing_and_shapes(base, out):
    cases = []
    name = "missing_blk1_ffn_down.gguf"
    write_gguf(base, os.path.join(out, name), tensors=without_tensor(base, "blk.1.ffn_down.weight"))
    cases.append(entry("missing_blk1_ffn_down", name, "missing-tensor", GEN,
                       ["blk.1.ffn_down.weight"], "one layer tensor missing"))
    name = "block_count_3.gguf"
    write_gguf(base, os.path.join(out, name), set_kv={"llama.block_count": (3, VT.UINT32)})
    cases.append(entry("block_count_3", name, "missing-tensor", GEN, ["blk.2"],
                       "block_count 3, tensors for 2 layers: a whole layer missing"))
    name = "missing_token_embd.gguf"
    write_gguf(base, os.path.join(out, name), tensors=without_tensor(base, "token_embd.weight"))
    cases.append(entry("missing_token_embd", name, "missing-tensor", GEN, ["token_embd.weight"],
                       "no embedding tensor"))

    rng = np.random.default_rng(7)
    name = "shape_attn_q_32rows.gguf"
    q = (rng.standard_normal((32, 64)) * 0.2).astype(np.float32)
    write_gguf(base, os.path.join(out, name),
               tensors=replace_tensor(base, "blk.0.attn_q.weight", q, Q.F32))
    cases.append(entry("shape_attn_q_32rows", name, "wrong-shape", GEN, ["blk.0.attn_q.weight"],
                       "attn_q has 32 rows, the config needs 64"))
    name = "shape_attn_norm_32.gguf"
    norm = np.ones(32, dtype=np.float32)
    write_gguf(base, os.path.join(out, name),
               tensors=replace_tensor(base, "blk.0.attn_norm.weight", norm, Q.F32))
    cases.append(entry("shape_attn_norm_32", name, "wrong-shape", GEN, ["blk.0.attn_norm.weight"],
                       "norm vector of 32, hidden is 64"))
    name = "shape_token_embd_transposed.gguf"
    embd = rng.standard_normal((64, 256)).astype(np.float32)  # [rows=64, cols=256]: transposed
    write_gguf(base, os.path.join(out, name),
               tensors=replace_tensor(base, "token_embd.weight", embd, Q.F32))
    cases.append(entry("shape_token_embd_transposed", name, "wrong-shape", GEN,
                       ["token_embd.weight"], "embedding stored [hidden, vocab]"))
    return cases


def vocab_gt_embedding(base, out):
    """Tokenizer has 256 tokens, embedding/LM head 128 rows."""
    cases = []
    half = []
    for n, d, t in base.tensors:
        if n in ("token_embd.weight", "output.weight"):
            d = d[:128].copy()  # Q8_0 rows are whole byte rows: the first 128 tokens
        half.append((n, d, t))
    name = "tok256_embd128.gguf"
    write_gguf(base, os.path.join(out, name), set_kv={"llama.vocab_size": (128, VT.UINT32)},
               tensors=half)
    why = ("tokenizer 256 tokens, model vocab 128: ids >= 128 (any non-ASCII byte) index past "
           "the embedding; generate silently skips them, perplexity panics")
    expect = ["vocab", "tokenizer"]
    utf8 = ["generate", "-m", "{FILE}", "-p", "héllo wörld ünïcödé", "-n", "2", "--raw"]
    ppl = ["perplexity", "-m", "{FILE}", "-f", "{OUT}/nonascii.txt", "-c", "64", "--chunks", "1"]
    cases.append(entry("tok256_embd128:generate", name, "c", utf8, expect, why))
    cases.append(entry("tok256_embd128:perplexity", name, "c", ppl, expect, why))
    cases.append(entry("tok256_embd128:perplexity-ascii", name, "c", PPL, expect,
                       why + " (ASCII text: every id < 128, so it may pass unnoticed)"))
    name = "tok256_embd128_nokey.gguf"
    write_gguf(base, os.path.join(out, name), drop_kv=("llama.vocab_size",), tensors=half)
    cases.append(entry("tok256_embd128_nokey:generate", name, "c", utf8,
                       ["vocab", "token_embd", "tokenizer"],
                       "no vocab_size key: vocab taken from the token list (256) vs 128 rows"))
    text = ("Ça a été une journée très agréable; la naïve façade du café, où l'on sert "
            "crème brûlée et smørrebrød, «déjà vu» — Zürich, São Paulo, Kraków. ") * 12
    with open(os.path.join(out, "nonascii.txt"), "w", encoding="utf-8") as f:
        f.write(text)
    return cases


TEMPLATES = [
    ("tmpl_range_1e9", "{% for i in range(10**9) %}x{% endfor %}",
     "range(10**9): minijinja refuses ranges over 100000 items, so this should fail fast"),
    ("tmpl_nested_loops", "{% for i in range(100000) %}{% for j in range(100000) %}"
     "{% endfor %}{% endfor %}ok",
     "1e10 empty iterations under minijinja's range cap: a CPU hang without fuel"),
    ("tmpl_str_mul_1e10", "{{ 'x' * 10**10 }}",
     "'x' * 1e10: minijinja refuses repeats over 100 MB, so this should fail fast"),
    ("tmpl_str_repeat_loop", "{% set a = 'x' * 100000000 %}{% for i in range(100000) %}{{ a }}"
     "{% endfor %}",
     "100 MB string printed 1e5 times: 10 TB of output"),
    ("tmpl_str_doubling", "{% set ns = namespace(s='x') %}{% for i in range(64) %}"
     "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}",
     "a string doubled 64 times by concatenation (no repeat cap applies): memory bomb"),
    ("tmpl_recursion", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
     "unbounded macro recursion: minijinja's recursion limit should turn this into an error"),
]


def chat_templates(base, out):
    cases = []
    for cid, src, why in TEMPLATES:
        name = cid + ".gguf"
        write_gguf(base, os.path.join(out, name),
                   set_kv={"tokenizer.chat_template": (src, VT.STRING)})
        cases.append(entry(cid, name, "d", GEN, ["template"], why))
    return cases


def big_metadata(base, out):
    cases = []
    name = "meta_u8_64mib.gguf"
    path = os.path.join(out, name)
    write_gguf(base, path, add_kv=[("kvrun.hostile.blob", [0], VT.ARRAY, VT.UINT8)])
    grow_array(path, "kvrun.hostile.blob", 1, 64 * MIB)
    cases.append(entry("meta_u8_64mib", name, "e", GEN_RAW, ["kvrun.hostile.blob"],
                       "64 MiB u8 array in metadata under a key nothing reads: walked at open, never decoded",
                       accept_success=True))
    name = "meta_str_8m_empty.gguf"
    path = os.path.join(out, name)
    write_gguf(base, path, add_kv=[("kvrun.hostile.strings", [""], VT.ARRAY, VT.STRING)])
    grow_array(path, "kvrun.hostile.strings", 8, 8 * MIB)
    cases.append(entry("meta_str_8m_empty", name, "e", GEN_RAW, ["kvrun.hostile.strings"],
                       "8M empty strings (64 MiB) under a key nothing reads: walked at open, never decoded",
                       accept_success=True))
    return cases


def overlapping(base, out):
    cases = []
    name = "overlap_output_on_embd.gguf"
    path = os.path.join(out, name)
    write_gguf(base, path)
    _, embd_off = tensor_offset_pos(path, "token_embd.weight")
    pos, _ = tensor_offset_pos(path, "output.weight")
    patch_u64(path, pos, embd_off)
    cases.append(entry("overlap_output_on_embd:generate", name, "f", GEN_RAW, ["overlap"],
                       "output.weight points at token_embd's bytes (same size, full overlap)"))
    cases.append(entry("overlap_output_on_embd:perplexity", name, "f", PPL, ["overlap"],
                       "same file: a PPL is printed from aliased weights"))
    name = "overlap_partial.gguf"
    path = os.path.join(out, name)
    write_gguf(base, path)
    _, q_off = tensor_offset_pos(path, "blk.0.attn_q.weight")
    pos, _ = tensor_offset_pos(path, "blk.0.attn_k.weight")
    patch_u64(path, pos, q_off + 1024)  # aligned (32), inside attn_q's 4352 bytes
    cases.append(entry("overlap_partial", name, "f", GEN_RAW, ["overlap"],
                       "blk.0.attn_k starts 1024 bytes into blk.0.attn_q"))
    return cases


def head_counts(base, out):
    cases = []
    name = "head_count_0.gguf"
    write_gguf(base, os.path.join(out, name),
               set_kv={"llama.attention.head_count": (0, VT.UINT32)})
    for args in (GEN, PLAN):
        cases.append(entry(f"head_count_0:{args[0]}", name, "g", args, ["head_count"],
                           "head_count 0: reported as a RoPE dimension mismatch today",
                           reject_any=["rope"]))
    name = "head_count_kv_0.gguf"
    write_gguf(base, os.path.join(out, name),
               set_kv={"llama.attention.head_count_kv": (0, VT.UINT32)})
    cases.append(entry("head_count_kv_0", name, "g", GEN, ["head_count_kv", "num_kv_heads"],
                       "head_count_kv 0"))
    return cases


def truncated_and_foreign(base, out):
    cases = []
    full = os.path.join(out, "_full.gguf")
    write_gguf(base, full)
    data = open(full, "rb").read()
    os.remove(full)
    cuts = [("trunc_empty.gguf", 0, "empty file"),
            ("trunc_header.gguf", 20, "cut inside the header"),
            ("trunc_metadata.gguf", 2000, "cut inside the token list"),
            ("trunc_tensor_data.gguf", len(data) - 1000, "last 1000 bytes of tensor data gone")]
    for name, n, why in cuts:
        with open(os.path.join(out, name), "wb") as f:
            f.write(data[:n])
        cases.append(entry(name[:-5], name, "truncated", GEN_RAW,
                           ["truncated", "empty", "too short", "incomplete", "remain"], why))
    name = "not_gguf.gguf"
    with open(os.path.join(out, name), "w") as f:
        f.write("this is a text file, not a model\n")
    cases.append(entry("not_gguf", name, "not-gguf", GEN_RAW, ["not a GGUF"],
                       "text file named .gguf"))
    name = "safetensors_as.gguf"
    shutil.copy(os.path.join(BASE_HF, "model.safetensors"), os.path.join(out, name))
    cases.append(entry("safetensors_as_gguf", name, "not-gguf", GEN_RAW, ["not a GGUF"],
                       "a safetensors file named .gguf"))
    return cases


def paths(out):
    cases = []
    os.mkfifo(os.path.join(out, "fifo.gguf"))
    cases.append(entry("path_fifo", "fifo.gguf", "path", GEN_RAW,
                       ["not a regular file", "fifo", "pipe"],
                       "a FIFO: must be refused, not reported as missing, never opened (blocks)",
                       reject_any=["no such file"]))
    os.symlink(os.path.join(out, "does-not-exist.gguf"), os.path.join(out, "dangling.gguf"))
    cases.append(entry("path_dangling_symlink", "dangling.gguf", "path", GEN_RAW,
                       ["symlink", "link", "no such file"], "a dangling symlink"))
    with open(os.path.join(out, "plainfile"), "w") as f:
        f.write("x")
    cases.append(entry("path_under_a_file", "plainfile/model.gguf", "path", GEN_RAW,
                       ["not a directory"],
                       "ENOTDIR: the path's parent is a file; reported as 'no such file' today",
                       reject_any=["no such file"]))
    os.mkdir(os.path.join(out, "empty_dir"))
    cases.append(entry("path_empty_dir", "empty_dir", "path", GEN_RAW, ["config.json"],
                       "a directory with nothing in it"))
    return cases


def drop_safetensor(path, name):
    """Rewrites a .safetensors file without tensor `name` (the header is JSON after its u64
    length; the other tensors' bytes keep their order, their offsets close the gap)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    del header[name]
    tensors = sorted((k for k in header if k != "__metadata__"),
                     key=lambda k: header[k]["data_offsets"][0])
    out, pos = bytearray(), 0
    for k in tensors:
        a, b = header[k]["data_offsets"]
        out += data[a:b]
        header[k]["data_offsets"] = [pos, pos + b - a]
        pos += b - a
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + bytes(out))


def new_architectures(out):
    """Qwen3 (assets/tiny-qwen3) and Gemma 3 as an HF directory (assets/tiny-gemma3-hf): a
    missing per-head norm, a norm of the wrong width, a head size the tensors contradict, a
    missing HF tensor under the architecture's own names."""
    cases = []
    q3 = Base(os.path.join(REPO, "assets", "tiny-qwen3", "tiny-qwen3-q8_0.gguf"))
    name = "qwen3_missing_q_norm.gguf"
    write_gguf(q3, os.path.join(out, name), tensors=without_tensor(q3, "blk.1.attn_q_norm.weight"))
    cases.append(entry("qwen3_missing_q_norm", name, "missing-tensor", GEN,
                       ["blk.1.attn_q_norm.weight"], "Qwen3 without one layer's Q norm"))
    name = "qwen3_k_norm_16.gguf"
    write_gguf(q3, os.path.join(out, name), tensors=replace_tensor(
        q3, "blk.0.attn_k_norm.weight", np.ones(16, dtype=np.float32), Q.F32))
    cases.append(entry("qwen3_k_norm_16", name, "wrong-shape", GEN, ["blk.0.attn_k_norm.weight"],
                       "Qwen3 K norm of 16 channels, head_dim is 32"))
    name = "qwen3_key_length_16.gguf"
    write_gguf(q3, os.path.join(out, name), set_kv={
        "qwen3.attention.key_length": (16, VT.UINT32),
        "qwen3.attention.value_length": (16, VT.UINT32)})
    cases.append(entry("qwen3_key_length_16", name, "wrong-shape", GEN,
                       ["blk.0.attn_q.weight", "key_length", "head_dim"],
                       "Qwen3 key_length 16, its projections and norms are 32 a head"))
    base_hf = os.path.join(REPO, "assets", "tiny-gemma3-hf", "hf")
    d = os.path.join(out, "hf_gemma3_no_post_ffw_norm")
    shutil.copytree(base_hf, d)
    drop_safetensor(os.path.join(d, "model.safetensors"),
                    "model.layers.3.post_feedforward_layernorm.weight")
    cases.append(entry("hf_gemma3_no_post_ffw_norm", "hf_gemma3_no_post_ffw_norm", "hf-config",
                       GEN_RAW, ["blk.3.post_ffw_norm.weight", "post_feedforward_layernorm"],
                       "HF Gemma 3 without one layer's post-MLP norm"))
    cases += qwen35_cases(out)
    cases += gemma4_cases(out)
    return cases


def gemma4_cases(out):
    """Gemma 4 (assets/tiny-gemma4): a global layer without its output scale, a KV-head list of
    the wrong length, a sliding-window pattern of integers, rope_freqs that are not
    proportional RoPE, per-layer embeddings (E-series), a global layer's K of the sliding
    layers' width, and an HF directory whose per_layer_config reshapes a sliding layer."""
    cases = []
    g = Base(os.path.join(REPO, "assets", "tiny-gemma4", "tiny-gemma4-q8_0.gguf"))
    name = "gemma4_no_layer_scale.gguf"
    write_gguf(g, os.path.join(out, name),
               tensors=without_tensor(g, "blk.2.layer_output_scale.weight"))
    cases.append(entry("gemma4_no_layer_scale", name, "missing-tensor", GEN,
                       ["blk.2.layer_output_scale.weight"],
                       "Gemma 4 without one layer's output scale"))
    name = "gemma4_kv_heads_5.gguf"
    write_gguf(g, os.path.join(out, name), drop_kv=("gemma4.attention.head_count_kv",),
               add_kv=[("gemma4.attention.head_count_kv", [2, 2, 1, 2, 2], VT.ARRAY, VT.UINT32)])
    cases.append(entry("gemma4_kv_heads_5", name, "metadata", GEN, ["head_count_kv"],
                       "Gemma 4 with 5 per-layer KV head counts for 6 layers"))
    name = "gemma4_swa_pattern_ints.gguf"
    write_gguf(g, os.path.join(out, name), drop_kv=("gemma4.attention.sliding_window_pattern",),
               add_kv=[("gemma4.attention.sliding_window_pattern", [1, 1, 0, 1, 1, 0],
                        VT.ARRAY, VT.INT32)])
    cases.append(entry("gemma4_swa_pattern_ints", name, "metadata", GEN,
                       ["sliding_window_pattern"],
                       "Gemma 4 sliding-window pattern as integers, not booleans"))
    name = "gemma4_rope_freqs_2.gguf"
    write_gguf(g, os.path.join(out, name), tensors=replace_tensor(
        g, "rope_freqs.weight", np.full(32, 2.0, dtype=np.float32), Q.F32))
    cases.append(entry("gemma4_rope_freqs_2", name, "metadata", GEN, ["rope_freqs"],
                       "Gemma 4 rope_freqs of 2.0: not proportional RoPE"))
    name = "gemma4_ple.gguf"
    write_gguf(g, os.path.join(out, name),
               set_kv={"gemma4.embedding_length_per_layer_input": (256, VT.UINT32)})
    cases.append(entry("gemma4_ple", name, "metadata", GEN, ["per-layer embeddings"],
                       "Gemma 4 E-series per-layer embeddings: refused by name"))
    name = "gemma4_global_k_32.gguf"
    write_gguf(g, os.path.join(out, name), tensors=replace_tensor(
        g, "blk.2.attn_k.weight", np.ones((32, 64), dtype=np.float32), Q.F32))
    cases.append(entry("gemma4_global_k_32", name, "wrong-shape", GEN, ["blk.2.attn_k.weight"],
                       "Gemma 4 global layer's K projection of 32 rows, its heads are 64 wide"))
    d = os.path.join(out, "hf_gemma4_sliding_reshaped")
    shutil.copytree(os.path.join(REPO, "assets", "tiny-gemma4", "hf"), d)
    cfg_path = os.path.join(d, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["per_layer_config"]["1"] = {"head_dim": 64}
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2)
    cases.append(entry("hf_gemma4_sliding_reshaped", "hf_gemma4_sliding_reshaped", "hf-config",
                       GEN_RAW, ["per_layer_config", "sliding"],
                       "HF Gemma 4 whose per_layer_config reshapes a sliding layer"))
    return cases


def qwen35_cases(out):
    """Qwen3.5 (assets/tiny-qwen35): a Gated DeltaNet layer without its decay, a conv of the
    wrong width, value channels that contradict the heads, a recurrent-layer list of the wrong
    type, a value-head count that is not whole groups of key heads, every layer recurrent, and
    an HF directory without one layer's dt_bias."""
    cases = []
    q = Base(os.path.join(REPO, "assets", "tiny-qwen35", "tiny-qwen35-q8_0.gguf"))
    name = "qwen35_missing_ssm_a.gguf"
    write_gguf(q, os.path.join(out, name), tensors=without_tensor(q, "blk.1.ssm_a"))
    cases.append(entry("qwen35_missing_ssm_a", name, "missing-tensor", GEN, ["blk.1.ssm_a"],
                       "Qwen3.5 without one DeltaNet layer's decay (ssm_a)"))
    name = "qwen35_conv_3_taps.gguf"
    write_gguf(q, os.path.join(out, name), tensors=replace_tensor(
        q, "blk.0.ssm_conv1d.weight", np.ones((512, 3), dtype=np.float32), Q.F32))
    cases.append(entry("qwen35_conv_3_taps", name, "wrong-shape", GEN,
                       ["blk.0.ssm_conv1d.weight"], "Qwen3.5 conv of 3 taps, ssm.conv_kernel is 4"))
    name = "qwen35_inner_size_200.gguf"
    write_gguf(q, os.path.join(out, name), set_kv={"qwen35.ssm.inner_size": (200, VT.UINT32)})
    cases.append(entry("qwen35_inner_size_200", name, "metadata", GEN,
                       ["inner_size"], "Qwen3.5 ssm.inner_size 200, not value heads × state size"))
    name = "qwen35_recurrent_layers_ints.gguf"
    write_gguf(q, os.path.join(out, name), drop_kv=("qwen35.attention.recurrent_layers",),
               add_kv=[("qwen35.attention.recurrent_layers", [1, 1, 1, 0], VT.ARRAY, VT.INT32)])
    cases.append(entry("qwen35_recurrent_layers_ints", name, "metadata", GEN,
                       ["recurrent_layers"], "Qwen3.5 recurrent_layers as integers, not booleans"))
    name = "qwen35_value_heads_3.gguf"
    write_gguf(q, os.path.join(out, name), set_kv={
        "qwen35.ssm.time_step_rank": (3, VT.UINT32), "qwen35.ssm.inner_size": (192, VT.UINT32)})
    cases.append(entry("qwen35_value_heads_3", name, "metadata", GEN, ["value heads"],
                       "Qwen3.5 with 3 value heads over 2 key heads"))
    name = "qwen35_all_recurrent.gguf"
    write_gguf(q, os.path.join(out, name), drop_kv=("qwen35.attention.recurrent_layers",),
               add_kv=[("qwen35.attention.recurrent_layers", [True] * 4, VT.ARRAY, VT.BOOL)])
    cases.append(entry("qwen35_all_recurrent", name, "metadata", GEN, ["attention layer"],
                       "Qwen3.5 whose every layer is recurrent: no layer attends"))
    d = os.path.join(out, "hf_qwen35_no_dt_bias")
    shutil.copytree(os.path.join(REPO, "assets", "tiny-qwen35", "hf"), d)
    drop_safetensor(os.path.join(d, "model.safetensors"), "model.layers.2.linear_attn.dt_bias")
    cases.append(entry("hf_qwen35_no_dt_bias", "hf_qwen35_no_dt_bias", "hf-config", GEN_RAW,
                       ["blk.2.ssm_dt.bias", "dt_bias"], "HF Qwen3.5 without one layer's dt_bias"))
    return cases


def hf_cases(out):
    cases = []
    config = json.load(open(os.path.join(BASE_HF, "config.json")))

    def hf_dir(name, changes):
        d = os.path.join(out, name)
        shutil.copytree(BASE_HF, d)
        c = dict(config, **changes)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f, indent=2)
        return d

    hf_dir("hf_layers_1e6", {"num_hidden_layers": 1_000_000})
    for args in (GEN_RAW, PLAN):
        cases.append(entry(f"hf_layers_1e6:{args[0]}", "hf_layers_1e6", "hf-config", args,
                           ["num_hidden_layers", "blk.2", "model.layers.2"],
                           "config.json: 1e6 layers, safetensors has 2"))
    hf_dir("hf_sizes_absurd", {"hidden_size": 2**20, "intermediate_size": 2**30,
                               "vocab_size": 2**31, "num_attention_heads": 16384,
                               "num_key_value_heads": 16384, "head_dim": 64})
    for args in (GEN_RAW, PLAN):
        cases.append(entry(f"hf_sizes_absurd:{args[0]}", "hf_sizes_absurd", "hf-config", args,
                           ["hidden_size", "intermediate_size", "vocab_size", "embed_tokens",
                            "token_embd"],
                           "config.json: hidden 2^20, FFN 2^30, vocab 2^31 over tiny tensors"))
    # Bare config.json for plan (weights estimated from the config): 2^62 x 2^20 wraps u64.
    name = "hf_vocab_wrap.json"
    with open(os.path.join(out, name), "w") as f:
        json.dump(dict(config, vocab_size=2**62, hidden_size=2**20, intermediate_size=2**30,
                       num_attention_heads=16384, num_key_value_heads=16384, head_dim=64), f)
    cases.append(entry("hf_vocab_wrap_json:plan", name, "f", PLAN,
                       ["vocab_size", "overflow", "too large"],
                       "bare config.json: parameter_count = 2 * 2^62 * 2^20 + ... wraps in u64"))
    name = "hf_layers_2e40.json"
    with open(os.path.join(out, name), "w") as f:
        json.dump(dict(config, num_hidden_layers=2**40, max_position_embeddings=2**40), f)
    cases.append(entry("hf_layers_2e40_json:plan", name, "f", PLAN + ["-c", "1099511627776"],
                       ["num_hidden_layers", "overflow", "too large"],
                       "bare config.json: 2^40 layers and context: KV byte arithmetic"))
    # Safetensors whose data is cut short: the header's offsets point past the end of the file.
    d = os.path.join(out, "hf_truncated_safetensors")
    shutil.copytree(BASE_HF, d)
    st = os.path.join(d, "model.safetensors")
    size = os.path.getsize(st)
    with open(st, "r+b") as f:
        f.truncate(size - 1000)
    cases.append(entry("hf_truncated_safetensors", "hf_truncated_safetensors", "truncated",
                       GEN_RAW, ["model.safetensors"],
                       "model.safetensors missing its last 1000 bytes"))
    return cases


def flag_cases():
    """Flags on the real model (classes b, f, g); {FILE} is the real model."""
    gen = ["generate", "-m", "{REAL}", "-p", "hi", "-n", "2"]
    ppl = ["perplexity", "-m", "{REAL}", "-f", "{TEXT}"]
    f = []

    def add(cid, cls, args, expect, names, why, reject=(), accept_success=False, asked_mib=0):
        f.append(entry(cid, "", cls, args, expect, why, names=names, reject_any=reject,
                       accept_success=accept_success, asked_mib=asked_mib))

    # (perplexity -c 1024 --max-num-batched-tokens 1024 was refused here for its 192 MiB of
    # logits; the engine now fits a scoring step's logit rows to the binding, so it runs. One
    # row a sequence must still fit: model/limits.rs's unit tests, as `serve --max-num-seqs`.)
    add("gen_mnbt_1e8", "b", gen + ["--max-num-batched-tokens", "100000000"],
        ["--max-num-batched-tokens"], "--max-num-batched-tokens",
        "activations sized for 1e8 tokens")
    add("bench_concurrency_1e5", "b",
        ["bench", "concurrency", "-m", "{REAL}", "--levels", "100000", "--prompt-tokens", "16",
         "--output-tokens", "2", "-c", "64"],
        ["--levels", "concurrency"], "--levels", "1e5 concurrent sequences: per-seq buffers")
    add("gen_kv_mem_100gib", "b", gen + ["--kv-cache-memory", "100GiB"],
        ["--kv-cache-memory"], "--kv-cache-memory", "KV budget larger than the device")
    add("gen_kv_mem_3_7gib", "b", gen + ["--kv-cache-memory", "3.7GiB"],
        ["--kv-cache-memory"], "--kv-cache-memory",
        "just under the per-layer binding cap (30 layers x 126 MiB): legal; may run (large RSS "
        "on lavapipe is the KV itself) or be refused against the device's memory",
        accept_success=True, asked_mib=int(3.7 * 1024))
    add("gen_kv_mem_10tib", "b", gen + ["--kv-cache-memory", "10TiB"],
        ["--kv-cache-memory"], "--kv-cache-memory", "KV budget far larger than the device")
    add("gen_kv_offload_1000tib", "b", gen + ["--kv-offloading-size", "1000TiB"],
        ["--kv-offloading-size", "host"], "--kv-offloading-size",
        "host tier larger than the host's memory")
    add("gen_kv_offload_1_byte", "b", gen + ["--kv-offloading-size", "1"],
        ["--kv-offloading-size", "block"], "--kv-offloading-size",
        "host tier smaller than one KV block")
    add("gen_kv_offload_no_cache", "b",
        gen + ["--kv-offloading-size", "64MiB", "--no-prefix-cache"],
        ["--kv-offloading-size", "prefix cache"], "--kv-offloading-size",
        "host tier without the prefix cache it hangs under")
    add("gen_kv_cache_dir_a_file", "b", gen + ["--kv-cache-dir", "{REAL}"],
        ["--kv-cache-dir"], "--kv-cache-dir", "a KV cache folder that is a file")
    add("gen_kv_cache_dir_size_1", "b",
        gen + ["--kv-cache-dir", "{OUT}/kv-dir", "--kv-cache-dir-size", "1"],
        ["--kv-cache-dir-size", "block"], "--kv-cache-dir-size",
        "a KV cache folder smaller than one block file")
    add("gen_block_size_0", "b", gen + ["--block-size", "0"], ["--block-size"], "--block-size",
        "block size 0")
    add("gen_block_size_1e6", "b", gen + ["--block-size", "1000000"], ["--block-size"],
        "--block-size", "block size larger than the context")
    add("ppl_chunks_0", "f", ppl + ["-c", "64", "--chunks", "0"], ["--chunks"], "--chunks",
        "--chunks 0 prints PPL = 1.0000 today (nothing scored)")
    add("plan_c_1e7", "f", ["plan", "-m", "{REAL}", "-c", "10000000"],
        ["-c", "context"], "-c", "plan -c beyond the model's 8192-token context is accepted")
    add("ppl_c3", "g", ppl + ["-c", "3", "--chunks", "1"], ["-c"], "-c",
        "says 'needs 4 <= -c <= 3' today", reject=["≤ 3"])
    add("gen_c_1e7", "g", gen + ["-c", "10000000"], ["-c"], "-c",
        "-c beyond the model's context on generate (refused already: a control)")
    return f


def main():
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} OUT_DIR  (e.g. /tmp/kvrun-hostile, outside the repo)")
    out = os.path.abspath(sys.argv[1])
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    base = Base(BASE_GGUF)
    cases = control(base, out)
    cases += absurd_sizes(base, out)
    cases += missing_and_shapes(base, out)
    cases += vocab_gt_embedding(base, out)
    cases += chat_templates(base, out)
    cases += big_metadata(base, out)
    cases += overlapping(base, out)
    cases += head_counts(base, out)
    cases += truncated_and_foreign(base, out)
    cases += paths(out)
    cases += hf_cases(out)
    cases += new_architectures(out)
    manifest = {
        "description": "hostile inputs for kvrun; see scripts/make_hostile_inputs.py",
        "bar": "exit non-zero with a one-line error naming the file or flag, in < 10 s and "
               "< 1 GB RSS, never a panic/abort/hang",
        "text": "assets/text/alice-ch1-9.txt",
        "real_model": "assets/models/SmolLM2-135M-Instruct.Q4_1.gguf",
        "cases": cases,
        "flag_cases": flag_cases(),
    }
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    n_files = len({c["file"] for c in cases})
    print(f"wrote {n_files} inputs, {len(cases)} file runs + {len(manifest['flag_cases'])} "
          f"flag runs to {out}/manifest.json")


if __name__ == "__main__":
    main()
