#!/usr/bin/env bash
# Decode attention time per token: MLA (the tiny DeepSeek-V2, 4 heads on one latent row of
# 96 + 32) vs an MHA model with the same 4 heads (each caching its own K and V of 64 channels,
# the qk_nope + qk_rope width), at the same contexts, on whatever adapter kvrun picks.
#
#   scripts/mla-vs-mha.sh [contexts] [kernel family]   # default 128,1024,4096 and auto;
#                                                      # writes target/mla-vs-mha/
#
# Both models get max_position_embeddings 8192 (the MLA one is assets/tiny-deepseek/hf with only
# that changed; the MHA twin has random weights: timing only). Needs python3 with numpy and
# safetensors, and a release build of kvrun.
set -euo pipefail
cd "$(dirname "$0")/.."
contexts=${1:-128,1024,4096}
family=${2:-auto}
out=target/mla-vs-mha
mkdir -p "$out/mla" "$out/mha"
python3 - "$out" <<'PY'
import json, os, shutil, sys
import numpy as np
from safetensors.numpy import save_file
out = sys.argv[1]
src = "assets/tiny-deepseek/hf"
cfg = json.load(open(f"{src}/config.json"))
cfg["max_position_embeddings"] = 8192
json.dump(cfg, open(f"{out}/mla/config.json", "w"), indent=2)
for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(f"{src}/{f}", f"{out}/mla/{f}")
H, D, HID, FFN, V = 4, 64, 64, 128, 256
mha = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HID,
       "intermediate_size": FFN, "num_hidden_layers": cfg["num_hidden_layers"],
       "num_attention_heads": H, "num_key_value_heads": H, "head_dim": D, "vocab_size": V,
       "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
       "tie_word_embeddings": False, "torch_dtype": "float32"}
json.dump(mha, open(f"{out}/mha/config.json", "w"), indent=2)
rng = np.random.default_rng(0)
n = lambda *s: (rng.standard_normal(s) * 0.1).astype(np.float32)
w = {"model.embed_tokens.weight": n(V, HID), "model.norm.weight": np.ones(HID, np.float32),
     "lm_head.weight": n(V, HID)}
for i in range(mha["num_hidden_layers"]):
    p = f"model.layers.{i}."
    w[p + "input_layernorm.weight"] = np.ones(HID, np.float32)
    w[p + "post_attention_layernorm.weight"] = np.ones(HID, np.float32)
    for name, shape in [("self_attn.q_proj", (H * D, HID)), ("self_attn.k_proj", (H * D, HID)),
                        ("self_attn.v_proj", (H * D, HID)), ("self_attn.o_proj", (HID, H * D)),
                        ("mlp.gate_proj", (FFN, HID)), ("mlp.up_proj", (FFN, HID)),
                        ("mlp.down_proj", (HID, FFN))]:
        w[p + name + ".weight"] = n(*shape)
save_file(w, f"{out}/mha/model.safetensors", metadata={"format": "pt"})
for f in ["tokenizer.json", "tokenizer_config.json"]:
    shutil.copy(f"{src}/{f}", f"{out}/mha/{f}")
PY
for m in mla mha; do
  echo "== $m"
  target/release/kvrun plan -m "$out/$m" -c 4096 | sed -n 2,3p
  target/release/kvrun bench decode -m "$out/$m" --context-lengths "$contexts" --kernel-family "$family" --json > "$out/$m.json"
  python3 - "$out/$m.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for p in r["points"]:
    att, gpu = p["attention_gpu_ms_per_token"], p["gpu_ms_per_token"]
    print(f"context {p['context_length']:>5}: decode {p['decode_tokens_per_s']:.1f} tok/s, "
          f"attention {att:.3f} ms/token of {gpu:.3f} ms GPU, KV read {p['step_bytes']['kv_full']} B")
PY
done
