#!/usr/bin/env bash
# Builds greedy_ids (assets/reference/tools/greedy_ids.cpp: llama.cpp's examples/simple/simple.cpp
# that also prints the prompt ids, the generated ids and the top-2 logits of every step) against the
# llama.cpp reference build of ../shared/tools/llamacpp-reference.sh. Prints the binary's path.
#   usage: build-greedy-ids.sh [REFERENCE_DIR]   (default: ~/.cache/llamacpp-reference)
#   then:  greedy_ids -m MODEL.gguf -n 16 "PROMPT"
set -euo pipefail
ref=${1:-$HOME/.cache/llamacpp-reference}
here=$(cd "$(dirname "$0")" && pwd)
src=$(ls -d "$ref"/llama_cpp_python-*/vendor/llama.cpp | head -1)
out="$ref/build/bin/greedy_ids"
g++ -O2 -std=c++17 "$here/greedy_ids.cpp" -I"$src/include" -I"$src/ggml/include" \
  -L"$ref/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$ref/build/bin" -o "$out" >&2
echo "$out"
