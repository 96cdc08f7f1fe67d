#!/usr/bin/env bash
# Fuzz smoke run for CI: installs cargo-fuzz if missing, builds the four targets of fuzz/
# (libFuzzer, no sanitizer: the crate is safe Rust but for the mmap), then runs each for
# FUZZ_SECS seconds (default 20) from its corpus fuzz/corpus/<target>/: the committed seeds
# (seed-*) plus whatever earlier runs grew there (git-ignored; cache it in CI). Any crash,
# timeout (> FUZZ_TIMEOUT s on one input) or OOM (> 2 GiB) fails the script; libFuzzer writes
# the input to fuzz/artifacts/<target>/ (git-ignored) — commit it under
# fuzz/regressions/<target>/ once fixed, and tests/fuzz_regressions.rs replays it.
#
# Measured on 2 shared cores: 150 s with cargo-fuzz installed and fuzz/target warm (65 s of it
# rebuilding kvrun after a change); a cold fuzz/target build took ~13 min, installing cargo-fuzz
# ~2 min.
#
# Only the stable toolchain is needed: RUSTC_BOOTSTRAP=1 lets it accept the -Z flags cargo-fuzz
# passes. Builds go to fuzz/target (cache it in CI: a cold build of kvrun's dependencies with
# coverage instrumentation is most of the run time).
#
#   scripts/fuzz-smoke.sh                 all targets, 20 s each
#   FUZZ_SECS=60 scripts/fuzz-smoke.sh gguf chat_template
set -euo pipefail
cd "$(dirname "$0")/.."

SECS=${FUZZ_SECS:-20}
TIMEOUT=${FUZZ_TIMEOUT:-10}
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(gguf hf_dir gguf_tokenizer chat_template)

if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --version 0.13.2 --locked
fi
export RUSTC_BOOTSTRAP=1
FUZZ_FLAGS=(--release --sanitizer none)

start=$(date +%s)
cargo fuzz build "${FUZZ_FLAGS[@]}"
echo "fuzz-smoke: build took $(($(date +%s) - start)) s"

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
for t in "${TARGETS[@]}"; do
    echo "fuzz-smoke: $t for $SECS s"
    log="$logs/$t.log"
    if ! cargo fuzz run "${FUZZ_FLAGS[@]}" "$t" -- \
        -max_total_time="$SECS" -timeout="$TIMEOUT" -rss_limit_mb=2048 -max_len=8192 \
        -print_final_stats=1 >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz-smoke: $t FAILED (input under fuzz/artifacts/$t/)"
        exit 1
    fi
    grep -E "DONE|stat::number_of_executed_units" "$log" || true
done
echo "fuzz-smoke: all targets ok in $(($(date +%s) - start)) s"
