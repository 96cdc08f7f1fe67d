#!/usr/bin/env bash
# One command for a machine with a real GPU (any vendor, any backend wgpu has): builds kvrun,
# runs the kernel tests with this device's own variants (and the tiny-model end to end test),
# `bench bandwidth`, `bench decode` at contexts 128 / 2048 / 8192 on each test model present
# (per-op GPU times and the roofline) and once sampled at 128 (temperature 0.8, top-p 0.95: the
# GPU draw's cost), `bench kv-quant` (f16 / int8 / int4 KV attention at
# context 2048, three alternating rounds: whether fewer KV bytes make attention faster on this
# device), and — when `llama-bench` is on PATH — llama.cpp on the same GGUF side by side.
# Writes everything under OUT plus one report.json and report.md.
#
#   scripts/gpu-check.sh [OUT]          (default OUT: gpu-check-<UTC time>/)
#   KVRUN_ADAPTER=NVIDIA scripts/gpu-check.sh    pick the adapter whose name contains this
#   GPU_CHECK_CONTEXTS=128,2048 scripts/gpu-check.sh
#   GPU_CHECK_KVQ_CONTEXTS=2048,8192   bench kv-quant's context lengths ("" skips it)
#
# The models are the ones scripts/fetch-models.sh puts in assets/models/ (run it first where
# the machine can reach PyPI, or copy the folder). Nothing here asserts a speed: the report is
# figures for the README (its GPU paragraph) and docs/measured.md.
#
# For a machine with no Rust toolchain or no room for the models (a lent GPU box):
#   GPU_CHECK_BIN=DIR        take kvrun and the test executables (named by test: kernel_linear,
#                            model_tiny, …) from DIR instead of building; DIR/kernels, if there,
#                            is the kernel bench (`cargo bench --bench kernels --no-run`).
#   GPU_CHECK_MODELS="a.gguf b.gguf"   the models to bench (default: the two real ones; "" none).
#   GPU_CHECK_SYNTH="llama-8b:q4_0 smollm2-135m:q4_1:VOCAB.gguf"   also build these
#                            random-weight models with scripts/synth-gguf.py (timing only; the
#                            vocabulary from VOCAB, default llama.cpp's Llama 3 one) and bench them.
#   GPU_CHECK_BENCH="REGEX"  run the kernel bench's benchmarks matching REGEX (default: none).
#   GPU_CHECK_STEP_TIMEOUT=S stop any one step after S seconds (default: no limit).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}
contexts=${GPU_CHECK_CONTEXTS:-128,2048,8192}
kvq_contexts=${GPU_CHECK_KVQ_CONTEXTS-2048}
mkdir -p "$out"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
export CARGO_TERM_COLOR=never
# kvrun and the tests honour WGPU_ADAPTER_NAME (and WGPU_BACKEND).
[ -z "${KVRUN_ADAPTER:-}" ] || export WGPU_ADAPTER_NAME="$KVRUN_ADAPTER"
log() { printf '== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)" | tee -a "$out/gpu-check.log"; }

limit=()
[ -z "${GPU_CHECK_STEP_TIMEOUT:-}" ] || limit=(timeout "$GPU_CHECK_STEP_TIMEOUT")
tests=(kernel_attention kernel_attention_kvq kernel_linear kernel_elementwise kernel_kv_quant
    kernel_bandwidth kernel_delta_net model_tiny model_tiny_gemma3)

if [ -n "${GPU_CHECK_BIN:-}" ]; then
    kvrun=$GPU_CHECK_BIN/kvrun
else
    log "build"
    cargo build --release 2>&1 | tail -n 3
    kvrun=target/release/kvrun
fi
"$kvrun" info --json >"$out/info.json"

log "kernel tests with this device's variants (and the discrete-GPU family forced where it differs)"
status=0
if [ -n "${GPU_CHECK_BIN:-}" ]; then
    for t in "${tests[@]}"; do
        echo "== $t" >>"$out/kernel-tests.log"
        KVRUN_NO_SKIP=1 "${limit[@]}" "$GPU_CHECK_BIN/$t" >>"$out/kernel-tests.log" 2>&1 || status=$?
    done
else
    KVRUN_NO_SKIP=1 "${limit[@]}" cargo test --release "${tests[@]/#/--test=}" \
        >"$out/kernel-tests.log" 2>&1 || status=$?
fi
grep -E "^test result:|FAILED|panicked" "$out/kernel-tests.log" | tee -a "$out/gpu-check.log" || true
echo "$status" >"$out/kernel-tests.status"

log "bench bandwidth"
"$kvrun" bench bandwidth --json >"$out/bandwidth.json"

models=(${GPU_CHECK_MODELS-assets/models/SmolLM2-135M-Instruct.Q4_1.gguf assets/models/gemma-3-270m-q4_k_m.gguf})
for spec in ${GPU_CHECK_SYNTH:-}; do
    IFS=: read -r shape type vocab <<<"$spec"
    file="$out/synth-$shape-$type.gguf"
    log "synthetic $shape $type (random weights)"
    python3 scripts/synth-gguf.py --shape "$shape" --type "$type" \
        --vocab "${vocab:-assets/models/llama-cpp-vocabs/ggml-vocab-llama-bpe.gguf}" "$file"
    models+=("$file")
done

for model in "${models[@]}"; do
    [ -f "$model" ] || { log "skip $(basename "$model"): not in assets/models/"; continue; }
    name=$(basename "$model" .gguf)
    log "bench decode $name at $contexts"
    "${limit[@]}" "$kvrun" bench decode -m "$model" --context-lengths "$contexts" --per-op --json \
        >"$out/decode-$name.json" 2>"$out/decode-$name.err" ||
        { log "bench decode $name failed (see decode-$name.err)"; rm -f "$out/decode-$name.json"; }
    # sampled decode (the draw on the GPU, kernels::sampling): its section is "sampled-NAME"
    log "bench decode $name sampled (--temperature 0.8 --top-p 0.95) at 128"
    "${limit[@]}" "$kvrun" bench decode -m "$model" --context-lengths 128 --temperature 0.8 --top-p 0.95 \
        --per-op --json >"$out/decode-sampled-$name.json" 2>"$out/decode-sampled-$name.err" ||
        { log "sampled bench decode $name failed"; rm -f "$out/decode-sampled-$name.json"; }
    if [ -n "$kvq_contexts" ]; then
        log "bench kv-quant $name: f16, int8, int4 at $kvq_contexts, 3 rounds"
        "${limit[@]}" "$kvrun" bench kv-quant -m "$model" --settings f16,int8,int4 --chunks 1 -c 128 \
            --context-lengths "$kvq_contexts" --timed-steps 16 --rounds 3 \
            --json "$out/kv-quant-$name.json" >"$out/kv-quant-$name.md" 2>"$out/kv-quant-$name.err" ||
            { log "bench kv-quant $name failed (see kv-quant-$name.err)"; rm -f "$out/kv-quant-$name.json"; }
    fi
    case $model in "$out"/synth-*) rm -f "$model" ;; esac
    if command -v llama-bench >/dev/null; then
        log "llama-bench $name"
        llama-bench -m "$model" -p 512 -n 128 -o json >"$out/llama-bench-$name.json" 2>"$out/llama-bench-$name.err" ||
            log "llama-bench $name failed (see llama-bench-$name.err)"
    fi
done

if [ -n "${GPU_CHECK_BENCH:-}" ]; then
    if [ -n "${GPU_CHECK_BIN:-}" ]; then
        bench=$GPU_CHECK_BIN/kernels
    else
        bench=$(cargo bench --bench kernels --no-run --message-format json 2>/dev/null |
            sed -n 's/.*"executable":"\([^"]*kernels-[^"]*\)".*/\1/p' | tail -n 1)
    fi
    log "kernel bench: $GPU_CHECK_BENCH"
    "${limit[@]}" "$bench" --bench "$GPU_CHECK_BENCH" >"$out/kernel-bench.log" 2>&1 ||
        log "kernel bench stopped (see kernel-bench.log)"
fi

log "report"
python3 - "$out" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
load = lambda p: json.load(open(p))
info, bw = load(f"{out}/info.json"), load(f"{out}/bandwidth.json")
report = {"info": info, "bandwidth": bw,
          "kernel_tests_exit_status": int(open(f"{out}/kernel-tests.status").read()),
          "decode": {}, "kv_quant": {}, "llama_bench": {}}
md = [f"# gpu-check: {bw['adapter']} ({bw['backend']}, {bw['device_type']})", "",
      f"kernel tests: exit status {report['kernel_tests_exit_status']} (kernel-tests.log)", "",
      f"bandwidth ({bw['timing']}, {bw['buffer_bytes'] >> 20} MiB): read {bw['read_gb_s']:.1f} GB/s, "
      f"copy {bw['copy_gb_s']:.1f} GB/s", ""]
for path in sorted(glob.glob(f"{out}/decode-*.json")):
    name = os.path.basename(path)[len("decode-"):-len(".json")]
    d = load(path)
    report["decode"][name] = d
    md += [f"## {name}", "", "| context | decode tok/s | GPU ms/token | attention ms | host ms/token | dispatches/token | readback B/token | bytes/step | GB/s | of read bw |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in d["points"]:
        r = p.get("roofline") or {}
        f = lambda v, fmt: fmt.format(v) if v is not None else "n/a"
        md.append(f"| {p['context_length']} | {p['decode_tokens_per_s']:.1f} | {f(p['gpu_ms_per_token'], '{:.3f}')} | "
                  f"{f(p['attention_gpu_ms_per_token'], '{:.3f}')} | {f(p.get('host_ms_per_token'), '{:.3f}')} | "
                  f"{f(p.get('dispatches_per_token'), '{:.0f}')} | {f(p.get('readback_bytes_per_token'), '{:.0f}')} | "
                  f"{p['step_bytes']['total'] / 2**20:.1f} MiB | "
                  f"{f(r.get('achieved_gb_s'), '{:.1f}')} | {f(r.get('fraction') and 100 * r['fraction'], '{:.1f} %')} |")
    lb = f"{out}/llama-bench-{name}.json"
    if os.path.exists(lb) and os.path.getsize(lb):
        rows = load(lb)
        report["llama_bench"][name] = rows
        md += ["", "llama-bench: " + ", ".join(
            f"{'pp' if r.get('n_prompt') else 'tg'}{r.get('n_prompt') or r.get('n_gen')} "
            f"{r.get('avg_ts', 0):.1f} tok/s" for r in rows)]
    md.append("")
for path in sorted(glob.glob(f"{out}/kv-quant-*.json")):
    # kvrun's own table (saved beside the JSON) goes into the report as it printed it.
    name = os.path.basename(path)[len("kv-quant-"):-len(".json")]
    report["kv_quant"][name] = load(path)
    md += [f"## {name}: KV formats", "", open(f"{out}/kv-quant-{name}.md").read().strip(), ""]
kb = f"{out}/kernel-bench.log"
if os.path.exists(kb):
    import re
    rows, name = [], None
    for line in open(kb):
        m = re.match(r"^(\S.*?)\s*(time:\s+\[(\S+ \S+) (\S+ \S+) (\S+ \S+)\])?\s*$", line)
        t = re.search(r"time:\s+\[(\S+ \S+) (\S+ \S+) (\S+ \S+)\]", line)
        if m and not line.startswith(" ") and not line.startswith("Benchmarking"):
            name = m.group(1).strip()
        if t and name:
            rows.append((name, t.group(2)))
    report["kernel_bench"] = [{"id": n, "median": t} for n, t in rows]
    md += ["## kernel bench (GPU time per call, criterion median)", "", "| benchmark | time |", "|---|---:|"]
    md += [f"| {n} | {t} |" for n, t in rows] + [""]
json.dump(report, open(f"{out}/report.json", "w"), indent=1)
open(f"{out}/report.md", "w").write("\n".join(md) + "\n")
print("\n".join(md))
PY
log "done: $out/report.md, $out/report.json"
exit "$status"
