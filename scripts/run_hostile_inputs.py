#!/usr/bin/env python3
"""Runs target/release/kvrun on every case of a make_hostile_inputs.py folder and judges each run.

    python3 scripts/make_hostile_inputs.py /tmp/kvrun-hostile
    python3 scripts/run_hostile_inputs.py /tmp/kvrun-hostile [--only SUBSTR] [--no-flags]
        [--kvrun PATH] [--timeout 20] [--rss-kill-gib 3] [--mem-limit-gib 0]

Runs one case at a time from the repo root under `/usr/bin/time -v` (max RSS, wall time), with
XDG_RUNTIME_DIR=/tmp and WGPU_BACKEND=vulkan unless already set, stdin closed and no core dumps.
A run still going after --timeout seconds is killed (SIGKILL to kvrun; /usr/bin/time still
reports its RSS), and so is one whose RSS passes --rss-kill-gib, so a memory bomb cannot push
the machine into the OOM killer (lavapipe backs "GPU" buffers with host memory, so an absurd
model grows RSS without bound). --mem-limit-gib sets RLIMIT_AS instead, which makes big
allocations fail inside kvrun, like a device with little memory would. Flag cases need
assets/models/SmolLM2-135M-Instruct.Q4_1.gguf (scripts/fetch-models.sh); they are skipped
without it.

The bar: exit non-zero with a one-line error naming the file (or the flag), containing one of
the case's expected words, in < 10 s and < 1 GB RSS, never a panic, abort or hang. Cases with
accept_success may instead exit 0 within the same time and memory. Writes results.json into the
folder and prints a Markdown table; exits 1 when any run misses the bar.
"""
import argparse
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WALL_LIMIT_S = 10.0
RSS_LIMIT_KB = 1024 * 1024  # 1 GiB


def substitute(args, out, file):
    real = os.path.join(REPO, "assets/models/SmolLM2-135M-Instruct.Q4_1.gguf")
    subs = {"{FILE}": os.path.join(out, file) if file else real, "{OUT}": out,
            "{TEXT}": "assets/text/alice-ch1-9.txt", "{REAL}": real}
    result = []
    for a in args:
        for k, v in subs.items():
            a = a.replace(k, v)
        result.append(a)
    return result


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def parse_time(path):
    info = {"max_rss_kb": None, "wall_s": None, "exit_status": None, "signal": None}
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError:
        return info
    for line in lines:
        line = line.strip()
        if line.startswith("Maximum resident set size"):
            info["max_rss_kb"] = int(line.rsplit(":", 1)[1])
        elif line.startswith("Exit status"):
            info["exit_status"] = int(line.rsplit(":", 1)[1])
        elif line.startswith("Command terminated by signal"):
            info["signal"] = int(line.rsplit(" ", 1)[1])
        elif line.startswith("Elapsed (wall clock)"):
            t = line.rsplit(": ", 1)[1].split(":")
            info["wall_s"] = sum(float(x) * 60 ** i for i, x in enumerate(reversed(t)))
    return info


ANSI = re.compile(r"\x1b\[[0-9;]*m")


def vm_rss_kb(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_one(kvrun, argv, timeout, mem_limit, rss_kill_kb, tmp):
    tfile, ofile, efile = (os.path.join(tmp, n) for n in ("time.txt", "stdout.txt", "stderr.txt"))
    for p in (tfile, ofile, efile):
        if os.path.exists(p):
            os.remove(p)
    env = dict(os.environ)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    env.setdefault("WGPU_BACKEND", "vulkan")

    def limits():
        if mem_limit:
            resource.setrlimit(resource.RLIMIT_AS, (mem_limit, mem_limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    start = time.monotonic()
    timed_out = rss_killed = False
    with open(ofile, "wb") as out, open(efile, "wb") as err:
        proc = subprocess.Popen(["/usr/bin/time", "-v", "-o", tfile, kvrun] + argv, cwd=REPO,
                                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                preexec_fn=limits, start_new_session=True)
        # Poll: a hang is killed at `timeout`, a memory bomb as soon as its RSS passes
        # `rss_kill_kb` (so it cannot push this machine into the OOM killer).
        while proc.poll() is None:
            time.sleep(0.02)
            kids = children(proc.pid)
            over = rss_kill_kb and any(vm_rss_kb(k) > rss_kill_kb for k in kids)
            late = time.monotonic() - start > timeout
            if over or late:
                rss_killed, timed_out = bool(over), not over
                for k in kids:
                    try:
                        os.kill(k, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
    elapsed = time.monotonic() - start
    t = parse_time(tfile)
    stderr = ANSI.sub("", open(efile, "rb").read().decode("utf-8", "replace"))
    stdout = open(ofile, "rb").read(4096).decode("utf-8", "replace")
    lines = [ln.strip() for ln in stderr.replace("\r", "\n").splitlines() if ln.strip()]
    panic = []
    for i, ln in enumerate(lines):
        if "panicked at" in ln:
            panic = [ln] + [x for x in lines[i + 1:i + 8]
                            if not x.startswith(("stack backtrace", "note:", "0:", "at "))]
            break
    errors = [ln for ln in lines if ln.startswith("error:")]
    return {
        # GNU time says "Exit status: 0" for a killed command: give the signal instead.
        "rc": (f"sig{t['signal']}" if t["signal"] else
               t["exit_status"] if t["exit_status"] is not None else proc.returncode),
        "signal": t["signal"],
        "timed_out": timed_out,
        "rss_killed": rss_killed,
        "wall_s": round(t["wall_s"] if t["wall_s"] is not None else elapsed, 2),
        "max_rss_mb": round(t["max_rss_kb"] / 1024, 1) if t["max_rss_kb"] else None,
        "panicked": bool(panic),
        "panic": panic[:5],
        "stderr_lines": len(lines),
        "stderr_head": lines[:2],
        "error_line": errors[0] if errors else "",
        "stdout_head": stdout.strip().splitlines()[-1][:200] if stdout.strip() else "",
    }


def doubled(text):
    """A clause said twice in one message ("X: X", "...: no such file; ...: no such file")."""
    parts = [p.strip().lower() for p in re.split(r"[;:]\s", text) if len(p.strip()) >= 12]
    return len(parts) != len(set(parts))


def judge(case, r, path):
    """(ok, reasons why not)."""
    bad = []
    if r["timed_out"]:
        bad.append("hang (timeout)")
    if r["rss_killed"]:
        bad.append("memory bomb (killed at the RSS cap)")
    if r["panicked"]:
        bad.append("panic")
    if r["signal"] and not (r["timed_out"] or r["rss_killed"]):
        bad.append(f"signal {r['signal']}")
    if r["wall_s"] is not None and r["wall_s"] >= WALL_LIMIT_S and not r["timed_out"]:
        bad.append(f"slow {r['wall_s']} s")
    if r["max_rss_mb"] is not None and r["max_rss_mb"] * 1024 >= RSS_LIMIT_KB:
        bad.append(f"RSS {r['max_rss_mb']} MB")
    if bad:
        return False, bad
    if r["rc"] == 0:
        return (True, []) if case["accept_success"] else (False, ["exit 0"])
    line = r["error_line"] or " ".join(r["stderr_head"])
    text = line.replace(path, "").lower() if path else line.lower()
    if r["stderr_lines"] != 1:
        bad.append(f"{r['stderr_lines']} stderr lines")
    if case["expect_any"] and not any(w.lower() in text for w in case["expect_any"]):
        bad.append("no expected word (" + "/".join(case["expect_any"]) + ")")
    hits = [w for w in case.get("reject_any", []) if w.lower() in text]
    if hits:
        bad.append("misleading (" + "/".join(hits) + ")")
    if doubled(line):
        bad.append("doubled clause")
    if case["names"] == "file":
        name = os.path.basename(case["file"].rstrip("/"))
        if name and name.lower() not in line.lower():
            bad.append("file not named")
    elif case["names"] and case["names"] not in line:
        bad.append(f"flag {case['names']} not named")
    return not bad, bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--kvrun", default=os.path.join(REPO, "target/release/kvrun"))
    ap.add_argument("--timeout", type=float, default=20)
    ap.add_argument("--mem-limit-gib", type=float, default=0,
                    help="RLIMIT_AS for kvrun (0: none); emulates a device with little memory")
    ap.add_argument("--rss-kill-gib", type=float, default=3,
                    help="kill a run whose RSS passes this (0: never)")
    ap.add_argument("--only", default="")
    ap.add_argument("--no-flags", action="store_true")
    a = ap.parse_args()
    out = os.path.abspath(a.out)
    manifest = json.load(open(os.path.join(out, "manifest.json")))
    runs = list(manifest["cases"])
    real = os.path.join(REPO, manifest["real_model"])
    if not a.no_flags:
        if os.path.exists(real):
            runs += manifest["flag_cases"]
        else:
            print(f"skipping flag cases: {real} is missing", file=sys.stderr)
    runs = [c for c in runs if a.only in c["id"]]
    tmp = os.path.join(out, ".run")
    os.makedirs(tmp, exist_ok=True)
    results = []
    for case in runs:
        argv = substitute(case["args"], out, case["file"])
        print(f"... {case['id']}", file=sys.stderr, flush=True)
        r = run_one(a.kvrun, argv, a.timeout, int(a.mem_limit_gib * 2**30),
                    int(a.rss_kill_gib * 2**20), tmp)
        path = os.path.join(out, case["file"]) if case["file"] else ""
        ok, why = judge(case, r, path)
        results.append(dict(case, argv=argv, result=r, ok=ok, why_not=why))
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1, ensure_ascii=False)
    print("| id | class | rc | panic | hang | RSS MB | wall s | verdict | what it said |")
    print("|---|---|---|---|---|---|---|---|---|")
    for x in results:
        r = x["result"]
        if r["panic"]:
            head = " / ".join(r["panic"][1:4])
        elif r["rc"] == 0:
            head = "stdout: " + r["stdout_head"]
        else:
            head = r["error_line"] or " / ".join(r["stderr_head"])
        head = head.replace(os.path.join(out, ""), "").replace("|", "\\|")[:170]
        ok = "ok" if x["ok"] else "FAIL: " + "; ".join(x["why_not"])
        hang = "timeout" if r["timed_out"] else "RSS cap" if r["rss_killed"] else ""
        print(f"| {x['id']} | {x['class']} | {r['rc']} | {'yes' if r['panicked'] else ''} | "
              f"{hang} | {r['max_rss_mb']} | {r['wall_s']} | {ok} | {head} |")
    n_bad = sum(not x["ok"] for x in results)
    print(f"\n{len(results) - n_bad} passed, {n_bad} failed")
    sys.exit(1 if n_bad else 0)


if __name__ == "__main__":
    main()
