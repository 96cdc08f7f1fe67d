#!/usr/bin/env bash
# A/B of the kernel benches (`cargo bench --bench kernels`) between two revisions, the two
# bench binaries alternating: on these VMs the same kernel drifts by tens of per cent within
# minutes, so one criterion run per revision, minutes apart, says little. Builds each
# revision's bench binary in a temporary git worktree (one build at a time, the shared target
# directory), then runs both ROUNDS times, old, new, old, new, …, with the same criterion
# filter, and prints per benchmark every run's median GPU time, the medians of those and
# new ÷ old. Writes the raw criterion output under OUT.
#
#   scripts/ab-kernels.sh OLD_REV [NEW_REV] [-- criterion filter]
#   scripts/ab-kernels.sh 3b11dca HEAD -- 'attention_decode/smollm2.*4096 .*/auto'
#   AB_ROUNDS=3 (default) AB_OUT=ab-kernels-<UTC time>/ (default)
#
# NEW_REV defaults to HEAD, the filter to every benchmark. Nothing here asserts a speed.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/ab-common.sh
ab_args "scripts/ab-kernels.sh OLD_REV [NEW_REV] [-- criterion filter]" "$@"
filter=${rest[0]:-}
rounds=${AB_ROUNDS:-3}
out=${AB_OUT:-ab-kernels-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$out"

# the path of the kernel bench binary cargo reports (stdin: its JSON messages)
bench_exe() {
    python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "kernels":
        print(m["executable"])'
}

build() { # REV NAME: builds REV's kernel bench binary into $out/NAME
    local exe
    exe=$(ab_in_tree "$1" cargo bench --bench kernels --no-run --message-format json 2>/dev/null |
        bench_exe)
    cp "$exe" "$out/$2"
    echo "built $1 ($(git rev-parse --short "$1")) as $out/$2"
}
build "$old" kernels-old
build "$new" kernels-new

for round in $(seq 1 "$rounds"); do
    for side in old new; do
        echo "round $round: $side"
        "$out/kernels-$side" --bench ${filter:+"$filter"} >"$out/$side-$round.txt" 2>&1
    done
done

python3 - "$out" "$rounds" "$(git rev-parse --short "$old")" "$(git rev-parse --short "$new")" <<'EOF'
import re, statistics, sys
out, rounds, old_rev, new_rev = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
unit = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}

def medians(path):
    """criterion's point estimate (the middle of `time: [lo mid hi]`) per benchmark, in ms"""
    found, name = {}, None
    for line in open(path, encoding="utf-8"):
        # a short name shares its line with `time:`, a long one has a line of its own
        head = line.split("time:")[0].rstrip()
        if head and not line.startswith(("Benchmarking", "Found", "Warning", " ", "\t")):
            name = head
        t = re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]", line)
        if t and name:
            found[name] = float(t.group(1)) * unit[t.group(2)]
            name = None
    return found

runs = {s: [medians(f"{out}/{s}-{r}.txt") for r in range(1, rounds + 1)] for s in ("old", "new")}
names = [n for n in runs["old"][0] if all(n in r for s in runs for r in runs[s])]
print(f"\nkernel benches A/B, {old_rev} (old) vs {new_rev} (new), {rounds} alternating rounds, GPU ms\n")
print("| benchmark | old runs | new runs | old median | new median | new ÷ old |")
print("|---|---|---|---:|---:|---:|")
for n in names:
    vals = {s: [r[n] for r in runs[s]] for s in runs}
    med = {s: statistics.median(v) for s, v in vals.items()}
    fmt = lambda v: " / ".join(f"{x:.3f}" for x in v)
    print(f"| {n} | {fmt(vals['old'])} | {fmt(vals['new'])} | {med['old']:.3f} | "
          f"{med['new']:.3f} | {med['new'] / med['old']:.2f} |")
EOF
