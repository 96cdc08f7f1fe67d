#!/usr/bin/env bash
# kvrun behind a prefix-cache-aware router: two `kvrun serve` workers behind smg (the
# "shepherd model gateway", PyPI package `smg`), a multi-user multi-turn chat workload sent
# through the router once with `--policy cache_aware` and once with `--policy random` (fresh
# workers each time, so both start with cold caches), and a Markdown table of requests routed,
# prefix-cache queries and hits (tokens, from each worker's /metrics) and the hit share.
#
#   scripts/router-demo.sh                      # tiny synthetic model, well under a minute
#   scripts/router-demo.sh --model smollm2      # SmolLM2-135M (realistic chat), a few minutes
#   scripts/router-demo.sh --model PATH.gguf --users 8 --turns 4 --max-tokens 8
#
# Options (environment variables in brackets):
#   --model tiny|smollm2|PATH  [ROUTER_DEMO_MODEL]  default tiny (assets/tiny-llama/tiny-llama-q.gguf)
#   --users N                  [ROUTER_DEMO_USERS]  default 8
#   --turns N                  [ROUTER_DEMO_TURNS]  default 4
#   --max-tokens N             [ROUTER_DEMO_MAX_TOKENS]  default 4 (tiny) / 8 (other models)
#   --system-words N           [ROUTER_DEMO_SYSTEM_WORDS]  default 120; each user's system prompt
#                              length in words, shrunk to fit the model's context
#   --policies "P1 P2"         [ROUTER_DEMO_POLICIES]  default "cache_aware random"
#   --keep-logs                keep the logs directory (printed at the end)
# Also read: KVRUN_BIN (default target/release/kvrun; this script never builds it),
# SMG_VERSION (pin the smg install), SMG_EXTRA_ARGS (more `smg launch` flags),
# KVRUN_EXTRA_ARGS (more `kvrun serve` flags), XDG_RUNTIME_DIR and WGPU_BACKEND (passed to kvrun;
# defaults /tmp and vulkan).
#
# Everything listens on 127.0.0.1 only, on free ports picked at start; every process this
# script starts is stopped when it exits, however it exits.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DRIVER="$ROOT/scripts/router_demo_workload.py"

MODEL="${ROUTER_DEMO_MODEL:-tiny}"
USERS="${ROUTER_DEMO_USERS:-8}"
TURNS="${ROUTER_DEMO_TURNS:-4}"
MAX_TOKENS="${ROUTER_DEMO_MAX_TOKENS:-}"
SYSTEM_WORDS="${ROUTER_DEMO_SYSTEM_WORDS:-120}"
POLICIES="${ROUTER_DEMO_POLICIES:-cache_aware random}"
KEEP_LOGS=0
KVRUN_BIN="${KVRUN_BIN:-$ROOT/target/release/kvrun}"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --model) MODEL="$2"; shift 2 ;;
        --users) USERS="$2"; shift 2 ;;
        --turns) TURNS="$2"; shift 2 ;;
        --max-tokens) MAX_TOKENS="$2"; shift 2 ;;
        --system-words) SYSTEM_WORDS="$2"; shift 2 ;;
        --policies) POLICIES="$2"; shift 2 ;;
        --keep-logs) KEEP_LOGS=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "router-demo: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done

case "$MODEL" in
    tiny) MODEL_PATH="$ROOT/assets/tiny-llama/tiny-llama-q.gguf"; : "${MAX_TOKENS:=4}" ;;
    smollm2) MODEL_PATH="$ROOT/assets/models/SmolLM2-135M-Instruct.Q4_1.gguf"; : "${MAX_TOKENS:=8}" ;;
    *) MODEL_PATH="$MODEL"; : "${MAX_TOKENS:=8}" ;;
esac
[ -e "$MODEL_PATH" ] || { echo "router-demo: model $MODEL_PATH is missing (scripts/fetch-models.sh fetches SmolLM2)" >&2; exit 1; }
[ -x "$KVRUN_BIN" ] || { echo "router-demo: $KVRUN_BIN is missing; build it first (cargo build --release)" >&2; exit 1; }
command -v python3 >/dev/null || { echo "router-demo: python3 is needed" >&2; exit 1; }

# smg, installed with pip when missing (`python3 -m smg` avoids depending on where pip put its
# console script).
if ! python3 -c 'import smg' 2>/dev/null; then
    echo "router-demo: installing smg${SMG_VERSION:+==$SMG_VERSION} with pip"
    python3 -m pip install --quiet "smg${SMG_VERSION:+==$SMG_VERSION}"
fi
SMG_VER="$(python3 -m smg --version 2>/dev/null || echo 'smg ?')"

LOGS="$(mktemp -d "${TMPDIR:-/tmp}/router-demo.XXXXXX")"
PIDS=()

# Stops what this script started, newest first (the router before its workers), each with
# TERM, then KILL after 10 s.
stop_all() {
    local i pid
    for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
        pid="${PIDS[$i]}"
        if ! kill -TERM "$pid" 2>/dev/null; then wait "$pid" 2>/dev/null || true; continue; fi
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    PIDS=()
}
# Runs a command in the background and waits for it, so that a signal is handled at once
# (bash defers traps while a foreground command runs).
FG_PID=
run_waited() {
    local rc=0
    "$@" &
    FG_PID=$!
    wait "$FG_PID" || rc=$?
    FG_PID=
    return "$rc"
}
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$FG_PID" ]; then kill -TERM "$FG_PID" 2>/dev/null || true; wait "$FG_PID" 2>/dev/null || true; fi
    stop_all
    if [ "$KEEP_LOGS" = 1 ] || [ "$rc" != 0 ]; then
        echo "router-demo: logs kept in $LOGS" >&2
    else
        rm -rf "$LOGS"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

show_log() { echo "---- last lines of $1" >&2; tail -n 20 "$1" | sed 's/\x1b\[[0-9;]*m//g' >&2 || true; }

# Four free loopback ports (two workers, the router, the router's metrics listener).
free_ports() {
    python3 - <<'EOF'
import socket
socks = []
for _ in range(4):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
for s in socks:
    s.close()
EOF
}

echo "router-demo: $SMG_VER, kvrun $("$KVRUN_BIN" --version | awk '{print $NF}'), model $MODEL_PATH"
echo "router-demo: $USERS users x $TURNS turns, max_tokens $MAX_TOKENS, policies: $POLICIES"

RESULTS=()
for POLICY in $POLICIES; do
    read -r P1 P2 PR PM <<<"$(free_ports)"
    W1="http://127.0.0.1:$P1"
    W2="http://127.0.0.1:$P2"
    ROUTER="http://127.0.0.1:$PR"
    echo "router-demo: [$POLICY] workers $W1 $W2, router $ROUTER"
    for port in "$P1" "$P2"; do
        # --metrics-vllm-names: smg identifies kvrun as a vLLM worker (it answers /version) and
        # polls /metrics for vLLM's load series.
        # shellcheck disable=SC2086
        XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}" WGPU_BACKEND="${WGPU_BACKEND:-vulkan}" \
            "$KVRUN_BIN" serve -m "$MODEL_PATH" --host 127.0.0.1 --port "$port" \
            --metrics-vllm-names ${KVRUN_EXTRA_ARGS:-} >"$LOGS/kvrun-$POLICY-$port.log" 2>&1 &
        PIDS+=($!)
    done
    for i in 0 1; do
        port=$([ $i = 0 ] && echo "$P1" || echo "$P2")
        run_waited python3 "$DRIVER" wait "http://127.0.0.1:$port" --pid "${PIDS[$i]}" --timeout 180 \
            || { show_log "$LOGS/kvrun-$POLICY-$port.log"; exit 1; }
    done
    # shellcheck disable=SC2086
    python3 -m smg launch --host 127.0.0.1 --port "$PR" \
        --prometheus-host 127.0.0.1 --prometheus-port "$PM" \
        --worker-urls "$W1" "$W2" --policy "$POLICY" --log-level warn --shutdown-grace-period-secs 1 \
        ${SMG_EXTRA_ARGS:-} >"$LOGS/smg-$POLICY.log" 2>&1 &
    PIDS+=($!)
    run_waited python3 "$DRIVER" wait "$ROUTER" --workers 2 --pid "${PIDS[2]}" --timeout 120 \
        || { show_log "$LOGS/smg-$POLICY.log"; exit 1; }

    OUT="$LOGS/result-$POLICY.json"
    run_waited python3 "$DRIVER" run --router "$ROUTER" --workers "$W1,$W2" --policy "$POLICY" --out "$OUT" \
        --users "$USERS" --turns "$TURNS" --max-tokens "$MAX_TOKENS" \
        --system-words "$SYSTEM_WORDS" --deadline 600 \
        || { show_log "$LOGS/smg-$POLICY.log"; exit 1; }
    RESULTS+=("$OUT")
    stop_all
done

python3 "$DRIVER" report "${RESULTS[@]}"
