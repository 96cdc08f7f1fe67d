#!/usr/bin/env bash
# A/B of `kvrun bench decode` between two revisions, the two binaries alternating (these
# machines drift by tens of per cent within minutes, so only runs made side by side compare).
# Builds each revision in a temporary git worktree (one build at a time, the shared target
# directory), then runs `bench decode --json` ROUNDS times per binary, old, new, old, new, …,
# and prints per context length every run's decode and prefill tok/s and GPU ms per token,
# their medians and new ÷ old of the medians. Writes the raw JSON under OUT.
#
#   scripts/ab-decode.sh OLD_REV [NEW_REV] [-- bench decode arguments]
#   scripts/ab-decode.sh 05768c7 HEAD -- --context-lengths 128,512
#   AB_ROUNDS=3 (default) AB_OUT=ab-<UTC time>/ (default)
#
# NEW_REV defaults to HEAD; the bench arguments default to --context-lengths 128,512. Both
# binaries get the same arguments (an older one may lack newer flags), plus --no-bandwidth
# where the binary has it. Nothing here asserts a speed.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/ab-common.sh
ab_args "scripts/ab-decode.sh OLD_REV [NEW_REV] [-- bench decode arguments]" "$@"
args=("${rest[@]}")
[ ${#args[@]} -gt 0 ] || args=(--context-lengths 128,512)
rounds=${AB_ROUNDS:-3}
out=${AB_OUT:-ab-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"

build() { # REV NAME: builds REV's kvrun into $out/NAME
    ab_in_tree "$1" cargo build --release -q
    cp "$target/release/kvrun" "$out/$2"
    echo "built $1 ($(git rev-parse --short "$1")) as $out/$2"
}
build "$old" kvrun-old
build "$new" kvrun-new

for round in $(seq 1 "$rounds"); do
    for side in old new; do
        bin=$out/kvrun-$side
        extra=()
        "$bin" bench decode --help | grep -q -- --no-bandwidth && extra=(--no-bandwidth)
        echo "round $round: $side"
        "$bin" bench decode "${args[@]}" "${extra[@]}" --json >"$out/$side-$round.json"
    done
done

python3 - "$out" "$rounds" "$(git rev-parse --short "$old")" "$(git rev-parse --short "$new")" <<'EOF'
import json, statistics, sys
out, rounds, old_rev, new_rev = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
runs = {s: [json.load(open(f"{out}/{s}-{r}.json")) for r in range(1, rounds + 1)]
        for s in ("old", "new")}
keys = [("decode_tokens_per_s", "decode tok/s"), ("prefill_tokens_per_s", "prefill tok/s"),
        ("gpu_ms_per_token", "GPU ms/token")]
print(f"\n`bench decode` A/B, {old_rev} (old) vs {new_rev} (new), {rounds} alternating rounds\n")
print("| context | figure | old runs | new runs | old median | new median | new ÷ old |")
print("|---:|---|---|---|---:|---:|---:|")
for i, point in enumerate(runs["old"][0]["points"]):
    ctx = point["context_length"]
    for key, name in keys:
        vals = {s: [run["points"][i][key] for run in runs[s]] for s in runs}
        med = {s: statistics.median(v) for s, v in vals.items()}
        fmt = lambda v: " / ".join(f"{x:.2f}" for x in v)
        print(f"| {ctx} | {name} | {fmt(vals['old'])} | {fmt(vals['new'])} | "
              f"{med['old']:.2f} | {med['new']:.2f} | {med['new'] / med['old']:.2f} |")
EOF
