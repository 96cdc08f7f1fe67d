#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a GPU machine that has no Rust toolchain and no room
# for the model files (a lent box reached by copying a folder): the release kvrun, the kernel
# and tiny-model test executables and the kernel bench, stripped and compressed; the gguf-py
# wheel (for scripts/synth-gguf.py); SmolLM2's tokenizer as a vocab-only GGUF; and run.sh.
#
#   scripts/gpu-bundle.sh DIR     (DIR inside the checkout, e.g. an ignored .gpu/)
#
# On the GPU machine, from the checkout's root (x86-64 Linux, glibc at least this machine's):
#   DIR/run.sh OUT                runs scripts/gpu-check.sh into OUT on random-weight models of
#                                 SmolLM2-135M (Q4_1) and Llama-3-8B (Q4_0) shapes. Needs
#                                 python3 with numpy, pyyaml, tqdm and requests.
# The test executables look for the checkout where it was built (CARGO_MANIFEST_DIR): run.sh
# links that path to the checkout when it is elsewhere and the user may create it.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gpu-bundle.sh DIR}
mkdir -p "$dir"
tests=(kernel_attention kernel_attention_kvq kernel_linear kernel_elementwise kernel_kv_quant
    kernel_bandwidth kernel_delta_net model_tiny model_tiny_gemma3)

cargo build --release
exes=$( (cargo test --release --no-run --message-format json "${tests[@]/#/--test=}"
    cargo bench --bench kernels --no-run --message-format json) 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    j = json.loads(line) if line.startswith("{") else {}
    if j.get("executable"):
        print(j["target"]["name"], j["executable"])')
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir "$stage/bin"
strip -o "$stage/bin/kvrun" target/release/kvrun
while read -r name exe; do strip -o "$stage/bin/$name" "$exe"; done <<<"$exes"
for t in "${tests[@]}" kernels; do
    [ -x "$stage/bin/$t" ] || { echo "no executable for $t" >&2; exit 1; }
done
tar cf - -C "$stage" bin | xz -T0 -6 >"$dir/bin.tar.xz"
printf '%s\n' "$PWD" >"$dir/built-in"

mkdir -p "$dir/whl"
python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir/whl" gguf
python3 scripts/synth-gguf.py --vocab-only --vocab assets/models/SmolLM2-135M-Instruct.Q4_1.gguf \
    "$dir/smollm2-vocab.gguf"
cp assets/models/llama-cpp-vocabs/ggml-vocab-llama-bpe.gguf "$dir/"

cat >"$dir/run.sh" <<'SH'
#!/usr/bin/env bash
# Written by scripts/gpu-bundle.sh: scripts/gpu-check.sh from this bundle. Run from the checkout.
set -u
dir=$(dirname "$0")
out=${1:-gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}
built=$(cat "$dir/built-in")
[ -e "$built" ] || { mkdir -p "$(dirname "$built")" && ln -s "$PWD" "$built"; } ||
    echo "warning: $built is missing, the tests that read assets/ will fail" >&2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/kvrun-site "$dir"/whl/*.whl && export PYTHONPATH=/tmp/kvrun-site
rm -rf /tmp/kvrun-bin && mkdir -p /tmp/kvrun-bin && tar xJf "$dir/bin.tar.xz" -C /tmp/kvrun-bin
GPU_CHECK_BIN=/tmp/kvrun-bin/bin GPU_CHECK_MODELS= \
GPU_CHECK_SYNTH="${GPU_CHECK_SYNTH:-smollm2-135m:q4_1:$dir/smollm2-vocab.gguf llama-8b:q4_0:$dir/ggml-vocab-llama-bpe.gguf}" \
GPU_CHECK_BENCH="${GPU_CHECK_BENCH:-llama8b.*/(auto|fused|separate)\$}" \
GPU_CHECK_STEP_TIMEOUT=${GPU_CHECK_STEP_TIMEOUT:-150} \
    scripts/gpu-check.sh "$out"
SH
chmod +x "$dir/run.sh"
du -sh "$dir"
