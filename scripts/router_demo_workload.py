#!/usr/bin/env python3
"""Multi-user, multi-turn chat workload for scripts/router-demo.sh (standard library only).

    router_demo_workload.py run --router URL --workers URL,URL --policy NAME --out FILE [...]
    router_demo_workload.py report FILE [FILE ...]
    router_demo_workload.py wait URL [--workers N] [--pid PID] [--timeout S]

`run` sends every user's conversation through the router (one thread per user, turns in order,
each turn resending the whole history as a chat client does), reads each worker's /metrics
before and after, and writes a JSON summary: per worker the requests it was routed (from the
router's `x-smg-routed-worker-id` answer header, cross-checked against the worker's own
`kvrun:e2e_request_latency_seconds_count`), and the deltas of `kvrun:prefix_cache_queries_total`
and `kvrun:prefix_cache_hits_total` (both in tokens). `report` prints those summaries as one
Markdown table.

The API is `chat` (POST /v1/chat/completions) when the model's context holds the conversation;
a model with a tiny context (the synthetic tiny-llama, 256 byte-tokens) gets `completions`
(POST /v1/completions with the same conversation as a plain-text transcript), since its chat
template alone would spend most of the context. The system prompts are sized from the model's
max_model_len (read from a worker's /v1/models and measured with its /tokenize) so that the
last turn still fits.
"""
import argparse
import json
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request

WORDS = (
    "account alpine amber anchor apricot archive aurora badge balance bamboo beacon billing "
    "blossom border bridge bronze budget cabin canyon carbon cargo cedar cellar channel "
    "charter cinder citrus clover cobalt comet compass copper coral cosmos crystal dawn delta "
    "desert dialect domain ember engine estate fabric falcon fern festival fjord forest "
    "fossil garden garnet glacier granite harbor harvest hazel helium horizon invoice island "
    "ivory jasper journey juniper kernel lagoon lantern ledger lemon lilac linen lotus lunar "
    "maple marble meadow mercury meteor mineral mosaic nectar nickel nomad oasis ocean olive "
    "onyx orbit orchard pebble pepper pilot pixel plaza prairie prism quartz quiver radar "
    "raven reef ribbon river saddle saffron sapphire shadow signal silver socket spruce "
    "summit tango thistle timber topaz tundra umber valley velvet vertex violet voyage walnut "
    "willow winter zephyr zinc"
).split()

QUESTIONS = [
    "What comes first?",
    "Say it briefly.",
    "And the next step?",
    "Anything to check?",
    "How long will it take?",
    "Who do I ask?",
    "Is it cheaper?",
    "Please summarise.",
]


def http_json(url, body=None, timeout=600.0):
    """GET (body None) or POST JSON; returns (parsed body, response headers, case-insensitive)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null"), resp.headers


def scrape(worker):
    """The `kvrun:*` counters this demo reads, from one worker's /metrics."""
    with urllib.request.urlopen(worker + "/metrics", timeout=30) as resp:
        text = resp.read().decode()
    want = {
        "kvrun:prefix_cache_queries_total": "queries",
        "kvrun:prefix_cache_hits_total": "hits",
        "kvrun:e2e_request_latency_seconds_count": "requests",
        "kvrun:prompt_tokens_total": "prompt_tokens",
    }
    out = {v: 0.0 for v in want.values()}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        parts = line.split()
        if len(parts) >= 2 and parts[0] in want:
            out[want[parts[0]]] = float(parts[1])
    missing = [k for k, v in want.items() if k not in text]
    if missing:
        raise SystemExit(f"{worker}/metrics lacks {', '.join(missing)}")
    return out


def system_prompt(user, n_words):
    """A long, user-specific system prompt (its first words already differ between users)."""
    rng = random.Random(1000 + user)
    notes = " ".join(rng.choice(WORDS) for _ in range(n_words))
    return f"User {user:02d} profile. Notes: {notes}."


def render_transcript(messages):
    """The plain-text transcript the completions API gets, ending where the reply goes."""
    parts = []
    for m in messages:
        prefix = {"system": "", "user": "Q: ", "assistant": "A: "}[m["role"]]
        parts.append(f"{prefix}{m['content']}\n")
    parts.append("A:")
    return "".join(parts)


def count_tokens(worker, model, api, messages):
    if api == "chat":
        r, _ = http_json(worker + "/tokenize", {"model": model, "messages": messages})
    else:
        r, _ = http_json(worker + "/tokenize", {"model": model, "prompt": render_transcript(messages)})
    return int(r["count"])


def worst_case_conversation(n_words, turns, max_tokens):
    # A reply of max_tokens tokens comes back as at most max_tokens U+FFFD (3 bytes each in a
    # byte-level tokenizer), so this over-counts the history that the last turn carries.
    msgs = [{"role": "system", "content": system_prompt(99, n_words)}]
    for t in range(turns):
        msgs.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
        if t + 1 < turns:
            msgs.append({"role": "assistant", "content": "\ufffd" * max_tokens})
    return msgs


def fit_system_words(worker, model, api, turns, max_tokens, want_words, max_model_len):
    """Most system-prompt words (<= want_words) whose last turn still fits the context."""
    budget = max_model_len - max_tokens - 2
    lo, hi = 0, want_words
    if count_tokens(worker, model, api, worst_case_conversation(0, turns, max_tokens)) > budget:
        raise SystemExit(
            f"{turns} turns do not fit the model's context ({max_model_len} tokens) even with an "
            f"empty system prompt; use fewer --turns or a smaller --max-tokens"
        )
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if count_tokens(worker, model, api, worst_case_conversation(mid, turns, max_tokens)) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return lo


def run(args):
    workers = [w.rstrip("/") for w in args.workers.split(",") if w]
    router = args.router.rstrip("/")
    models, _ = http_json(workers[0] + "/v1/models")
    model = models["data"][0]["id"]
    max_model_len = int(models["data"][0].get("max_model_len") or 2048)
    routed_models, _ = http_json(router + "/v1/models")
    if model not in [m["id"] for m in routed_models.get("data", [])]:
        raise SystemExit(f"the router does not list model {model!r}: {routed_models}")

    api = args.api
    if api == "auto":
        api = "chat" if max_model_len >= 1024 else "completions"
    words = fit_system_words(
        workers[0], model, api, args.turns, args.max_tokens, args.system_words, max_model_len
    )
    probe = worst_case_conversation(words, args.turns, args.max_tokens)
    first = count_tokens(workers[0], model, api, probe[:2])
    last = count_tokens(workers[0], model, api, probe)
    print(
        f"[{args.policy}] model {model} (context {max_model_len}), api {api}, "
        f"{args.users} users x {args.turns} turns, max_tokens {args.max_tokens}, "
        f"system prompt {words} words: first turn ~{first} tokens, last turn <= {last}",
        flush=True,
    )

    before = {w: scrape(w) for w in workers}
    lock = threading.Lock()
    routed = {w: 0 for w in workers}
    landing = {}  # user -> list of workers, one per turn
    errors = []
    sem = threading.Semaphore(args.concurrency)
    deadline = time.time() + args.deadline

    def one_user(user):
        msgs = [{"role": "system", "content": system_prompt(user, words)}]
        path = []
        for turn in range(args.turns):
            if time.time() > deadline:
                with lock:
                    errors.append(f"user {user}: deadline reached before turn {turn + 1}")
                break
            msgs.append({"role": "user", "content": QUESTIONS[(user + turn) % len(QUESTIONS)]})
            common = {"model": model, "max_tokens": args.max_tokens, "temperature": 0}
            if api == "chat":
                url, body = router + "/v1/chat/completions", dict(common, messages=msgs)
            else:
                url, body = router + "/v1/completions", dict(common, prompt=render_transcript(msgs))
            try:
                with sem:
                    resp, headers = http_json(url, body, timeout=args.request_timeout)
            except (urllib.error.URLError, OSError, ValueError) as e:
                detail = e.read().decode(errors="replace")[:300] if hasattr(e, "read") else ""
                with lock:
                    errors.append(f"user {user} turn {turn + 1}: {e} {detail}")
                break
            choice = resp["choices"][0]
            reply = choice["message"]["content"] if api == "chat" else choice["text"]
            msgs.append({"role": "assistant", "content": reply})
            worker = headers.get("x-smg-routed-worker-id")
            with lock:
                if worker in routed:
                    routed[worker] += 1
                path.append(worker or "?")
        with lock:
            landing[user] = path

    t0 = time.time()
    threads = [threading.Thread(target=one_user, args=(u,), daemon=True) for u in range(args.users)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, deadline - time.time() + args.request_timeout))
    elapsed = time.time() - t0
    time.sleep(0.5)  # counters are bumped as requests finish; let the last ones land
    after = {w: scrape(w) for w in workers}

    per_worker = {}
    header_seen = sum(routed.values()) > 0
    if not header_seen:
        print(f"[{args.policy}] note: the router sent no x-smg-routed-worker-id header; "
              "counting requests routed from each worker's finished requests", file=sys.stderr)
    for w in workers:
        d = {k: after[w][k] - before[w][k] for k in after[w]}
        d["routed"] = routed[w] if header_seen else int(d["requests"])
        per_worker[w] = d
        if routed[w] and int(d["requests"]) != routed[w]:
            print(
                f"[{args.policy}] note: {w} finished {int(d['requests'])} requests, "
                f"router header says {routed[w]}",
                file=sys.stderr,
            )
    sticky = sum(1 for p in landing.values() if p and len(set(p)) == 1)
    summary = {
        "policy": args.policy,
        "model": model,
        "api": api,
        "users": args.users,
        "turns": args.turns,
        "max_tokens": args.max_tokens,
        "system_words": words,
        "elapsed_s": round(elapsed, 1),
        "workers": per_worker,
        "landing": {str(u): p for u, p in sorted(landing.items())},
        "users_on_one_server": sticky,
        "errors": errors,
    }
    with open(args.out, "w") as f:
        json.dump(summary, f, indent=1)
    for e in errors:
        print(f"[{args.policy}] error: {e}", file=sys.stderr)
    print(
        f"[{args.policy}] done in {elapsed:.1f} s; {sticky}/{len(landing)} users stayed on one "
        f"server; {len(errors)} errors",
        flush=True,
    )
    return 1 if errors else 0


def wait(args):
    """Poll until a kvrun worker answers /health, or a router lists N healthy workers."""
    deadline = time.time() + args.timeout
    url = args.url.rstrip("/")
    last = "no answer yet"
    while time.time() < deadline:
        if args.pid:
            try:
                os.kill(args.pid, 0)
            except OSError:
                print(f"process {args.pid} behind {url} exited while starting", file=sys.stderr)
                return 1
        try:
            if args.workers:
                body, _ = http_json(url + "/workers", timeout=5)
                ready = [w for w in body.get("workers", []) if w.get("is_healthy")
                         and w.get("status", "ready") == "ready"]
                models, _ = http_json(url + "/v1/models", timeout=5)
                if len(ready) >= args.workers and models.get("data"):
                    return 0
                last = f"{len(ready)} of {args.workers} workers ready"
            else:
                with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                    if resp.status == 200:
                        return 0
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = str(e)
        time.sleep(0.5)
    print(f"{url} not ready after {args.timeout:.0f} s ({last})", file=sys.stderr)
    return 1


def share(hits, queries):
    return f"{100.0 * hits / queries:.1f}%" if queries else "n/a"


def report(args):
    rows = []
    for path in args.files:
        with open(path) as f:
            s = json.load(f)
        tot = {"routed": 0, "queries": 0.0, "hits": 0.0}
        for i, (w, d) in enumerate(sorted(s["workers"].items())):
            name = f"server {i + 1} ({w.split('//')[-1]})"
            rows.append((s["policy"], name, d["routed"], d["queries"], d["hits"]))
            for k in tot:
                tot[k] += d[k]
        rows.append((s["policy"], "**total**", tot["routed"], tot["queries"], tot["hits"]))
        meta = s
    print(
        f"\nModel `{meta['model']}` via /v1/{'chat/completions' if meta['api'] == 'chat' else 'completions'}, "
        f"{meta['users']} users x {meta['turns']} turns, max_tokens {meta['max_tokens']}, "
        f"system prompt {meta['system_words']} words; prefix-cache counts are prompt tokens."
    )
    if meta["api"] == "completions":
        print(
            f"(The model's context is too small for a chat template around {meta['turns']} turns, "
            "so each conversation goes as a plain-text transcript.)"
        )
    print()
    print("| policy | server | requests routed | prefix-cache queries | prefix-cache hits | hit share |")
    print("|---|---|---:|---:|---:|---:|")
    for policy, name, routed, q, h in rows:
        print(f"| {policy} | {name} | {routed} | {int(q)} | {int(h)} | {share(h, q)} |")
    print()
    for path in args.files:
        with open(path) as f:
            s = json.load(f)
        print(
            f"- {s['policy']}: {s['users_on_one_server']}/{s['users']} users kept every turn on one "
            f"server; ran {s['elapsed_s']} s; {len(s['errors'])} errors"
        )
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the workload through the router once")
    r.add_argument("--router", required=True, help="router base URL, e.g. http://127.0.0.1:30000")
    r.add_argument("--workers", required=True, help="comma-separated kvrun base URLs (for /metrics)")
    r.add_argument("--policy", required=True, help="label for this run (the router's policy)")
    r.add_argument("--out", required=True, help="where to write the JSON summary")
    r.add_argument("--users", type=int, default=8)
    r.add_argument("--turns", type=int, default=4)
    r.add_argument("--max-tokens", type=int, default=8)
    r.add_argument("--system-words", type=int, default=120,
                   help="system prompt length in words, at most (shrunk to fit the context)")
    r.add_argument("--api", choices=["auto", "chat", "completions"], default="auto")
    r.add_argument("--concurrency", type=int, default=8, help="requests in flight at most")
    r.add_argument("--request-timeout", type=float, default=300.0)
    r.add_argument("--deadline", type=float, default=600.0,
                   help="no new turn starts after this many seconds")
    rep = sub.add_parser("report", help="print run summaries as one Markdown table")
    rep.add_argument("files", nargs="+")
    w = sub.add_parser("wait", help="wait for a worker's /health or a router's workers")
    w.add_argument("url")
    w.add_argument("--workers", type=int, default=0, help="router: wait for this many healthy workers")
    w.add_argument("--pid", type=int, default=0, help="give up if this process exits")
    w.add_argument("--timeout", type=float, default=120.0)
    args = p.parse_args()
    if args.cmd == "run":
        if args.users < 1 or args.turns < 1 or args.max_tokens < 1 or args.concurrency < 1:
            p.error("--users, --turns, --max-tokens and --concurrency must be at least 1")
        return run(args)
    if args.cmd == "wait":
        return wait(args)
    return report(args)


if __name__ == "__main__":
    sys.exit(main())
