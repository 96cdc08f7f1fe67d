"""Shared by the scripts that build kvrun's tiny random-weight models with HF transformers as the
reference (assets/tiny-qwen3/, assets/tiny-gemma3-hf/): a byte-level tokenizer the llama.cpp
converter accepts, the converter itself, float64 reference logits and gguf-py dequantization.

Needs torch (CPU), transformers 5.2x, numpy, gguf, safetensors, tokenizers; LLAMA_CPP (default
~/.cache/llamacpp-reference/llama_cpp_python-0.3.36/vendor/llama.cpp, which
../shared/tools/llamacpp-reference.sh unpacks) for convert_hf_to_gguf.py. Run once; the outputs
are committed, so CI needs none of this.
"""
import json
import os
import subprocess
import sys

import numpy as np

LLAMA_CPP = os.environ.get(
    "LLAMA_CPP",
    os.path.expanduser("~/.cache/llamacpp-reference/llama_cpp_python-0.3.36/vendor/llama.cpp"))
# llama.cpp's CPU tools (llama-perplexity), as ../shared/tools/llamacpp-reference.sh builds them
LLAMA_CPP_BIN = os.environ.get(
    "LLAMA_CPP_BIN", os.path.expanduser("~/.cache/llamacpp-reference/build/bin"))

# The perplexity every tiny model is scored on, by transformers, llama.cpp and kvrun alike
# (llama-perplexity's convention: chunks of CTX tokens, each from an empty cache, the second
# half of each chunk's predictions scored).
PPL_TEXT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "text",
                        "alice-ch1-9.txt")
PPL_CTX, PPL_CHUNKS = 128, 4

N_GOLDEN_TOKENS = 40


def byte_tokens():
    """GPT-2's byte-to-unicode table: the 256 byte tokens of a byte-level BPE, in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def write_tokenizer(out, chat_template, bos=None, eos=None, special=()):
    """tokenizer.json (byte-level BPE: 256 byte tokens, one merge "Ġ" + "t" = id 256, then the
    `special` tokens) and tokenizer_config.json. Returns the vocabulary size. The converter
    wants BPE merges; a vocabulary without any is refused."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    vocab = {t: i for i, t in enumerate(byte_tokens())}
    vocab["Ġt"] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("Ġ", "t")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    tok.save(os.path.join(out, "tokenizer.json"))
    config = {"chat_template": chat_template, "bos_token": bos, "eos_token": eos,
              "model_max_length": 256, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    return 257 + len(special)


def convert(hf_dir, out_path, outtype, pre, extra_args=()):
    """llama.cpp's convert_hf_to_gguf.py on hf_dir, with the tokenizer's pre-tokenizer declared
    as `pre` (the converter identifies it by hashing how the tokenizer splits a test text, which
    no tiny vocabulary reproduces; the weights and every other key are the converter's own) and
    the converter's own `extra_args` (e.g. --no-mtp)."""
    code = (
        "import sys, runpy\n"
        f"sys.path.insert(0, {LLAMA_CPP!r})\n"
        f"sys.path.insert(1, {os.path.join(LLAMA_CPP, 'gguf-py')!r})\n"
        "import conversion.base as base\n"
        f"base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}\n"
        f"sys.argv = ['convert_hf_to_gguf.py', {hf_dir!r}, '--outfile', {out_path!r},"
        f" '--outtype', {outtype!r}] + {list(extra_args)!r}\n"
        f"runpy.run_path({os.path.join(LLAMA_CPP, 'convert_hf_to_gguf.py')!r},"
        " run_name='__main__')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def gguf_arrays(path):
    """Every tensor of a GGUF as float64, dequantized by gguf-py, in numpy's (outermost
    first) shape."""
    import gguf
    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        data = gguf.quants.dequantize(t.data, t.tensor_type)
        shape = [int(d) for d in reversed(t.shape.tolist())]
        out[t.name] = np.asarray(data, dtype=np.float64).reshape(shape)
    return out


def logits_f64(model, ids):
    """transformers' forward of `model` in float64 over `ids`: [len(ids), vocab]."""
    import torch
    model = model.to(torch.float64).eval()
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=False).logits[0]
    return out.numpy()


def text_ids(hf_dir):
    """PPL_TEXT as the HF directory's tokenizer splits it (no special tokens: none is added)."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(hf_dir, "tokenizer.json"))
    with open(PPL_TEXT, encoding="utf-8") as f:
        return tok.encode(f.read(), add_special_tokens=False).ids


def perplexity_f64(model, ids):
    """llama-perplexity's PPL of `ids` under transformers' float64 forward of `model`."""
    import math
    import torch
    model = model.to(torch.float64).eval()
    nll, count = 0.0, 0
    for c in range(PPL_CHUNKS):
        chunk = torch.tensor([ids[c * PPL_CTX:(c + 1) * PPL_CTX]])
        with torch.no_grad():
            logp = torch.log_softmax(model(chunk, use_cache=False).logits[0], -1)
        for i in range(PPL_CTX // 2, PPL_CTX - 1):
            nll -= logp[i, chunk[0, i + 1]].item()
            count += 1
    return math.exp(nll / count)


def llama_perplexity(gguf_path):
    """llama.cpp's llama-perplexity on PPL_TEXT: its running PPL after the last chunk (what its
    Final estimate says). llama.cpp's logger writes from a thread of its own and may lose the
    last lines at exit, so the running values (`[4]526.9747,`) count too, and a run that shows
    neither is repeated."""
    import re
    for _ in range(3):
        out = subprocess.run(
            [os.path.join(LLAMA_CPP_BIN, "llama-perplexity"), "-m", gguf_path, "-f", PPL_TEXT,
             "-c", str(PPL_CTX), "--chunks", str(PPL_CHUNKS), "-b", str(PPL_CTX)],
            check=True, capture_output=True, text=True)
        text = out.stdout + out.stderr
        final = re.findall(r"Final estimate: PPL = ([0-9.]+)", text)
        running = re.findall(rf"\[{PPL_CHUNKS}\]([0-9.]+),", text)
        if final or running:
            return float((final or running)[-1])
    raise RuntimeError(f"llama-perplexity printed no PPL for {gguf_path}")


def write_golden(path, ids, logits_by_variant, extra=None):
    golden = {
        "token_ids": [int(i) for i in ids],
        "logits_shape": list(next(iter(logits_by_variant.values())).shape),
        "logits": {k: [[round(float(x), 6) for x in row] for row in v]
                   for k, v in logits_by_variant.items()},
    }
    golden.update(extra or {})
    with open(path, "w") as f:
        json.dump(golden, f)
        f.write("\n")


def read_golden(path):
    with open(path) as f:
        return json.load(f)


# GGUF names (llama.cpp's) of the tensors outside the layers → HF names.
GGUF_TO_HF = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name, layer_names):
    """The HF name of a GGUF tensor: `layer_names` maps a layer tensor's GGUF base name
    (`attn_q`) to its HF module path (`self_attn.q_proj`)."""
    if gguf_name in GGUF_TO_HF:
        return GGUF_TO_HF[gguf_name]
    _, layer, rest = gguf_name.split(".", 2)
    base, suffix = rest.rsplit(".", 1)
    return f"model.layers.{layer}.{layer_names[base]}.{suffix}"


def build(here, name, seed, make_model, chat_template, layer_names, pre, norm_shift=0.0,
          gguf_state=None):
    """Writes everything a tiny model's script promises, next to it (`here`):
    hf/ (the byte-level tokenizer and `make_model(vocab)`'s save_pretrained), NAME-f32.gguf and
    NAME-q8_0.gguf (llama.cpp's converter, the pre-tokenizer declared as `pre`), golden.json
    (40 token ids and transformers' float64 logits of hf/ and of the Q8_0 GGUF's dequantized
    weights loaded back into the same model, their norms less the converter's `norm_shift`; the
    perplexity of PPL_TEXT under both and llama.cpp's llama-perplexity on both GGUFs).
    `make_model(vocab)` must build the same seeded model every call; `seed` draws the token ids.
    `gguf_state(arrays)`, where the GGUF's tensors do not map one to one onto the HF parameters
    (stacked experts), turns the dequantized GGUF arrays into the HF state dict (norms already
    shifted). Returns the vocabulary size."""
    import torch
    hf = os.path.join(here, "hf")
    os.makedirs(hf, exist_ok=True)
    vocab = write_tokenizer(hf, chat_template)
    make_model(vocab).save_pretrained(hf, safe_serialization=True)
    ids = np.random.default_rng(seed).integers(0, vocab, N_GOLDEN_TOKENS)
    f32 = os.path.join(here, f"{name}-f32.gguf")
    q8 = os.path.join(here, f"{name}-q8_0.gguf")
    convert(hf, f32, "f32", pre)
    convert(hf, q8, "q8_0", pre)
    logits = {"hf_f32": logits_f64(make_model(vocab), ids.tolist())}
    q_model = make_model(vocab).to(torch.float64)
    arrays = {k: v - norm_shift if k.endswith("norm.weight") else v
              for k, v in gguf_arrays(q8).items()}
    if gguf_state is not None:
        state = {k: torch.from_numpy(v) for k, v in gguf_state(arrays).items()}
    else:
        state = {hf_name(k, layer_names): torch.from_numpy(v) for k, v in arrays.items()}
    missing, unexpected = q_model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    q_model.tie_weights()
    logits["gguf_q8_0"] = logits_f64(q_model, ids.tolist())
    text = text_ids(hf)
    ppl = {
        "text": "assets/text/alice-ch1-9.txt", "ctx": PPL_CTX, "chunks": PPL_CHUNKS,
        "transformers_f64": {"hf_f32": perplexity_f64(make_model(vocab), text),
                             "gguf_q8_0": perplexity_f64(q_model, text)},
        "llama_cpp": {os.path.basename(f): llama_perplexity(f) for f in (f32, q8)},
    }
    write_golden(os.path.join(here, "golden.json"), ids, logits, {"perplexity": ppl})
    print("wrote", hf, f32, q8, "golden.json")
    return vocab


def add_f16_kv_references(here, name, make_model, gguf_state, patched):
    """golden.json's "f16_kv" entry: logits and perplexity of the same two transformers
    forwards as `build` (hf/, and the Q8_0 GGUF's dequantized weights through `gguf_state`), run
    inside the context manager `patched`, which rounds what kvrun's (and llama.cpp's) default
    f16 KV cache stores to f16 — where that rounding moves a model's perplexity more than the
    f32 forwards' own error, kvrun's f16-KV runs are held to these."""
    import torch
    path = os.path.join(here, "golden.json")
    golden = read_golden(path)
    ids = golden["token_ids"]
    vocab = golden["logits_shape"][1]
    q_model = make_model(vocab).to(torch.float64)
    arrays = gguf_arrays(os.path.join(here, f"{name}-q8_0.gguf"))
    state = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in gguf_state(arrays).items()}
    missing, unexpected = q_model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    q_model.tie_weights()
    text = text_ids(os.path.join(here, "hf"))
    entry = {"logits": {}, "perplexity": {}}
    with patched():
        for variant, model in [("hf_f32", make_model(vocab)), ("gguf_q8_0", q_model)]:
            logits = logits_f64(model, ids)
            entry["logits"][variant] = [[round(float(x), 6) for x in row] for row in logits]
            entry["perplexity"][variant] = perplexity_f64(model, text)
    golden["f16_kv"] = entry
    with open(path, "w") as f:
        json.dump(golden, f)
        f.write("\n")
