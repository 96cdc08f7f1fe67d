#!/usr/bin/env python3
"""Writes assets/reference/llama-cpp-tiny-moe.json: llama.cpp's greedy runs (greedy_ids, see
../README.md) on the tiny mixture-of-experts GGUFs, two prompts of 16 tokens each, for
tests/model_tiny_moe.rs (kvrun on each GGUF and on the HF directory of the same weights).
    usage: tiny_moe_greedy.py GREEDY_IDS   (GREEDY_IDS: what build-greedy-ids.sh prints)"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..", "..")
MODELS = [
    "assets/tiny-qwen3moe/tiny-qwen3moe-f32.gguf",
    "assets/tiny-qwen35moe/tiny-qwen35moe-f32.gguf",
    "assets/tiny-deepseek-moe/tiny-deepseek-moe-f32.gguf",
    "assets/tiny-deepseek-v3/tiny-deepseek-v3-f32.gguf",
]
# Not gpt-oss: llama.cpp's YaRN truncates the correction range where the model's config says not
# to (assets/tiny-gpt-oss/make_tiny_gpt_oss.py), which moves this tiny model's logits by ~1
# (measured: "Alice was beginning to get very tired" step 3, kvrun 1.66 / 1.60 and llama.cpp
# 2.65 / 2.49 for the same two tokens); transformers is its reference.
PROMPTS = ["Alice was beginning to get very tired", "The Queen of Hearts, she made some tarts"]


def main():
    exe = sys.argv[1]
    with open(os.path.join(HERE, "..", "llama-cpp-smollm2.json")) as f:
        build = json.load(f)["llama_cpp"]
    out = {
        "what": "llama.cpp's greedy runs on the tiny mixture-of-experts GGUFs (random weights); "
                "how they were produced: assets/reference/README.md",
        "llama_cpp": build,
        "command": "greedy_ids -m MODEL -n 16 PROMPT",
        "models": {},
    }
    for model in MODELS:
        prompts = []
        for prompt in PROMPTS:
            run = subprocess.run([sys.executable, os.path.join(HERE, "greedy_json.py"), exe,
                                  os.path.join(ROOT, model), "16", prompt],
                                 capture_output=True, check=True, text=True)
            prompts.append(json.loads(run.stdout))
        out["models"][model] = {"greedy": {"prompts": prompts}}
    with open(os.path.join(HERE, "..", "llama-cpp-tiny-moe.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
