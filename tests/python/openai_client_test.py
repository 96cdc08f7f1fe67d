#!/usr/bin/env python3
"""End-to-end check of `kvrun serve` with the official `openai` Python client.

Usage:
    python3 tests/python/openai_client_test.py [BASE_URL [API_KEY]]

BASE_URL defaults to $KVRUN_BASE_URL, then http://127.0.0.1:8000 (with or without a trailing
/v1); API_KEY defaults to $KVRUN_API_KEY (none if unset: then the wrong-key check is skipped).
The served model name and its context length come from GET /v1/models.

Needs `openai`, `jsonschema` and `prometheus-client` (scripts/setup.sh installs them). Prints one line per
check and ends with `N passed, M failed`; the exit status is 1 when any check failed.

Against the tiny synthetic model:
    target/release/kvrun serve -m assets/tiny-llama/tiny-llama-q.gguf --port 18300 \
        --api-key test-key -c 256 &
    python3 tests/python/openai_client_test.py http://127.0.0.1:18300 test-key
"""

import argparse
import http.client
import json
import os
import sys
import time
import traceback
import urllib.parse

import jsonschema
import openai
import pydantic
from prometheus_client.openmetrics.parser import text_string_to_metric_families

MAX_TOKENS = 12  # small: the whole script runs in seconds against the tiny model
CHAT_MESSAGES = [
    {"role": "system", "content": "You are a terse assistant. Answer in one short sentence."},
    {"role": "user", "content": "Name three colours of the rainbow and say why the sky is blue."},
]
COMPLETION_PROMPT = "The quick brown fox jumps over the lazy dog. Once upon a time, there was"
STOP_PROMPT = "Here is a short list of fruits: apples, pears, plums, cherries and"


# --------------------------------------------------------------------------------------------
# Raw HTTP


class Raw:
    """Raw HTTP to the server's root (http.client: exact status, headers and body bytes)."""

    def __init__(self, root: str, api_key):
        url = urllib.parse.urlsplit(root)
        if url.scheme not in ("http", "https"):
            raise SystemExit(f"base URL {root!r} must start with http:// or https://")
        self.https = url.scheme == "https"
        self.host = url.hostname
        self.port = url.port or (443 if self.https else 80)
        self.prefix = url.path.rstrip("/")
        self.api_key = api_key

    def request(self, method, path, body=None, auth=True, headers=None, timeout=60):
        """Returns (status, headers dict with lower-case names, body bytes)."""
        conn_cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
        conn = conn_cls(self.host, self.port, timeout=timeout)
        hdrs = dict(headers or {})
        if auth and self.api_key:
            hdrs["Authorization"] = f"Bearer {self.api_key}"
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        if body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        try:
            conn.request(method, self.prefix + path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, data
        finally:
            conn.close()

    def json(self, method, path, body=None, auth=True, expect=200):
        status, _, data = self.request(method, path, body, auth=auth)
        assert status == expect, (
            f"{method} {path}: expected HTTP {expect}, got {status}: {data[:500]!r}"
        )
        try:
            return json.loads(data)
        except ValueError as e:
            raise AssertionError(f"{method} {path}: body is not JSON ({e}): {data[:500]!r}")

    def sse(self, path, body):
        """POSTs a streaming request; returns (content-type, list of `data:` payloads)."""
        status, headers, data = self.request("POST", path, body)
        assert status == 200, f"POST {path} (stream): expected 200, got {status}: {data[:500]!r}"
        events = []
        for line in data.decode("utf-8").split("\n"):
            line = line.rstrip("\r")
            if line.startswith("data:"):
                events.append(line[5:].lstrip(" "))
        return headers.get("content-type", ""), events


def assert_error_shape(body, status, where):
    """The OpenAI error shape: {"error": {"message", "type", "param", "code"}}."""
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), (
        f"{where}: body is not {{'error': {{...}}}}: {body!r}"
    )
    err = body["error"]
    missing = [k for k in ("message", "type", "param", "code") if k not in err]
    assert not missing, f"{where}: error object lacks {missing}: {err!r}"
    assert isinstance(err["message"], str) and err["message"], (
        f"{where}: error.message should be a non-empty string: {err!r}"
    )
    assert isinstance(err["type"], str) and err["type"], (
        f"{where}: error.type should be a non-empty string: {err!r}"
    )
    assert err["code"] in (status, str(status)), (
        f"{where}: error.code should be the HTTP status {status}: {err!r}"
    )
    return err


# --------------------------------------------------------------------------------------------
# Checks


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, name, fn):
        t0 = time.monotonic()
        try:
            detail = fn()
        except AssertionError as e:
            self.failed += 1
            print(f"FAIL  {name}: {e}", flush=True)
            return False
        except Exception as e:  # an unexpected exception is a failure too, with its trace
            self.failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {e}", flush=True)
            traceback.print_exc(limit=4, file=sys.stdout)
            return False
        self.passed += 1
        extra = f" ({detail})" if detail else ""
        print(f"ok    {name}{extra} [{time.monotonic() - t0:.2f}s]", flush=True)
        return True


def usage_ok(usage, where, completion_tokens=None):
    """Checks usage fields; returns cached_tokens."""
    assert usage is not None, f"{where}: usage is missing"
    assert isinstance(usage.prompt_tokens, int) and usage.prompt_tokens > 0, (
        f"{where}: usage.prompt_tokens should be a positive int: {usage!r}"
    )
    assert isinstance(usage.completion_tokens, int) and usage.completion_tokens >= 1, (
        f"{where}: usage.completion_tokens should be an int >= 1: {usage!r}"
    )
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens, (
        f"{where}: usage.total_tokens {usage.total_tokens} != prompt_tokens "
        f"{usage.prompt_tokens} + completion_tokens {usage.completion_tokens}"
    )
    if completion_tokens is not None:
        assert usage.completion_tokens <= completion_tokens, (
            f"{where}: usage.completion_tokens {usage.completion_tokens} > max_tokens "
            f"{completion_tokens}"
        )
    details = usage.prompt_tokens_details
    assert details is not None, f"{where}: usage.prompt_tokens_details is missing: {usage!r}"
    cached = details.cached_tokens
    assert isinstance(cached, int) and not isinstance(cached, bool), (
        f"{where}: usage.prompt_tokens_details.cached_tokens should be an int, got {cached!r}"
    )
    assert 0 <= cached <= usage.prompt_tokens, (
        f"{where}: cached_tokens {cached} outside [0, prompt_tokens {usage.prompt_tokens}]"
    )
    return cached


def scrape(raw):
    """GET /metrics without credentials, parsed strictly as OpenMetrics: {family name: family}."""
    status, headers, data = raw.request("GET", "/metrics", auth=False)
    assert status == 200, f"GET /metrics (no auth): expected 200, got {status}: {data[:300]!r}"
    text = data.decode("utf-8")
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as e:
        raise AssertionError(f"GET /metrics is not valid OpenMetrics text: {type(e).__name__}: {e}")
    names = [f.name for f in families]
    dup = {n for n in names if names.count(n) > 1}
    assert not dup, f"GET /metrics: families declared more than once: {sorted(dup)}"
    return {f.name: f for f in families}, headers.get("content-type", "")


def sample_value(families, family, sample_name, labels=None):
    fam = families.get(family)
    assert fam is not None, f"metric family {family!r} is missing"
    for s in fam.samples:
        if s.name == sample_name and (labels is None or s.labels == labels):
            return s.value
    raise AssertionError(f"metric family {family!r} has no sample {sample_name!r}: {fam.samples!r}")


def pick_stop(text):
    """A short printable substring of `text` whose first occurrence starts at index >= 2 (so the
    cut output is non-empty), and the index of that first occurrence."""
    for length in (2, 1, 3):
        for i in range(2, len(text) - length + 1):
            cand = text[i:i + length]
            if (cand.isprintable() and not cand.isspace() and "\ufffd" not in cand
                    and text.find(cand) == i):
                return cand, i
    return None, None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("base_url", nargs="?",
                    default=os.environ.get("KVRUN_BASE_URL", "http://127.0.0.1:8000"))
    ap.add_argument("api_key", nargs="?", default=os.environ.get("KVRUN_API_KEY"))
    args = ap.parse_args()

    root = args.base_url.rstrip("/")
    if root.endswith("/v1"):
        root = root[: -len("/v1")]
    raw = Raw(root, args.api_key)
    client = openai.OpenAI(base_url=root + "/v1", api_key=args.api_key or "none",
                           max_retries=0, timeout=120.0)
    checks = Checks()
    state = {}

    # ---- server basics ------------------------------------------------------------------------

    def health():
        deadline = time.monotonic() + 60
        while True:
            try:
                status, _, _ = raw.request("GET", "/health", auth=False, timeout=5)
                if status == 200:
                    break
            except OSError:
                status = "no connection"
            assert time.monotonic() < deadline, f"GET /health never answered 200 (last: {status})"
            time.sleep(0.5)
        version = raw.json("GET", "/version", auth=False)
        assert isinstance(version.get("version"), str) and version["version"], (
            f"GET /version: expected {{'version': str}}, got {version!r}"
        )
        return f"version {version['version']}"

    def models():
        listing = client.models.list()
        data = list(listing.data)
        assert len(data) == 1, f"GET /v1/models: expected one model, got {len(data)}: {data!r}"
        model = data[0]
        assert model.id, f"GET /v1/models: empty model id: {model!r}"
        rawlist = raw.json("GET", "/v1/models")
        max_len = rawlist["data"][0].get("max_model_len")
        assert isinstance(max_len, int) and max_len > 0, (
            f"GET /v1/models: data[0].max_model_len should be a positive int: {rawlist!r}"
        )
        state["model"] = model.id
        state["max_model_len"] = max_len
        return f"model {model.id!r}, max_model_len {max_len}"

    if not checks.run("GET /health = 200, GET /version", health) or not checks.run(
        "GET /v1/models (model name, max_model_len)", models
    ):
        print(f"{checks.passed} passed, {checks.failed} failed")
        return 1
    model = state["model"]

    # ---- chat ---------------------------------------------------------------------------------

    def chat_once():
        return client.chat.completions.create(
            model=model, messages=CHAT_MESSAGES, temperature=0, max_tokens=MAX_TOKENS)

    def chat_nonstream():
        r = chat_once()
        assert r.object == "chat.completion", f"object should be 'chat.completion': {r.object!r}"
        assert r.id, "response id is empty"
        assert len(r.choices) == 1, f"expected 1 choice, got {len(r.choices)}"
        c = r.choices[0]
        assert c.message.role == "assistant", f"message.role should be assistant: {c.message!r}"
        assert isinstance(c.message.content, str) and c.message.content, (
            f"message.content should be a non-empty string: {c.message.content!r}"
        )
        assert c.finish_reason in ("stop", "length"), f"finish_reason: {c.finish_reason!r}"
        cached = usage_ok(r.usage, "chat", MAX_TOKENS)
        state["chat_text"] = c.message.content
        state["chat_usage"] = r.usage
        return (f"{r.usage.completion_tokens} tokens, finish {c.finish_reason}, "
                f"cached_tokens {cached}, text {c.message.content!r}")

    def chat_repeat_cached():
        r = chat_once()
        cached = usage_ok(r.usage, "repeated chat", MAX_TOKENS)
        assert cached > 0, (
            f"the same chat request again should hit the prefix cache "
            f"(prompt_tokens {r.usage.prompt_tokens}): cached_tokens = {cached}"
        )
        if "chat_text" in state:
            assert r.choices[0].message.content == state["chat_text"], (
                f"greedy output changed on a prefix-cache hit: {state['chat_text']!r} then "
                f"{r.choices[0].message.content!r}"
            )
        state["cache_hit_seen"] = True
        return f"cached_tokens {cached} of {r.usage.prompt_tokens}"

    def chat_stream():
        stream = client.chat.completions.create(
            model=model, messages=CHAT_MESSAGES, temperature=0, max_tokens=MAX_TOKENS,
            stream=True, stream_options={"include_usage": True})
        pieces, finishes, usage_chunks, after_usage, roles = [], [], [], 0, []
        for chunk in stream:
            assert chunk.object == "chat.completion.chunk", f"chunk object: {chunk.object!r}"
            if usage_chunks:
                after_usage += 1
            if chunk.usage is not None:
                assert chunk.choices == [], (
                    f"the usage chunk should have empty choices: {chunk.choices!r}"
                )
                usage_chunks.append(chunk.usage)
                continue
            assert len(chunk.choices) == 1, f"a content chunk has {len(chunk.choices)} choices"
            ch = chunk.choices[0]
            if ch.delta.role:
                roles.append(ch.delta.role)
            if ch.delta.content:
                pieces.append(ch.delta.content)
            if ch.finish_reason is not None:
                finishes.append(ch.finish_reason)
        text = "".join(pieces)
        assert len(usage_chunks) == 1, f"expected exactly one usage chunk, got {len(usage_chunks)}"
        assert after_usage == 0, f"{after_usage} chunk(s) came after the usage chunk"
        assert finishes and len(finishes) == 1 and finishes[0] in ("stop", "length"), (
            f"expected one finish_reason (stop/length) chunk, got {finishes!r}"
        )
        assert roles[:1] == ["assistant"], f"the first delta should carry role assistant: {roles!r}"
        usage_ok(usage_chunks[0], "chat stream usage chunk", MAX_TOKENS)
        if "chat_text" in state:
            assert text == state["chat_text"], (
                f"streamed text != non-streamed greedy text:\n  stream:     {text!r}\n"
                f"  non-stream: {state['chat_text']!r}"
            )
            assert usage_chunks[0].completion_tokens == state["chat_usage"].completion_tokens, (
                f"streamed completion_tokens {usage_chunks[0].completion_tokens} != non-streamed "
                f"{state['chat_usage'].completion_tokens}"
            )
        return f"{len(pieces)} content chunks, finish {finishes[0]}"

    def chat_stream_raw():
        ctype, events = raw.sse("/v1/chat/completions", {
            "model": model, "messages": CHAT_MESSAGES, "temperature": 0,
            "max_tokens": MAX_TOKENS, "stream": True, "stream_options": {"include_usage": True}})
        assert ctype.startswith("text/event-stream"), f"content-type: {ctype!r}"
        assert events, "no `data:` events in the stream"
        assert events[-1] == "[DONE]", f"the stream should end with `data: [DONE]`: {events[-3:]!r}"
        assert events.count("[DONE]") == 1, f"[DONE] sent {events.count('[DONE]')} times"
        objs = [json.loads(e) for e in events[:-1]]
        errors = [o for o in objs if "error" in o]
        assert not errors, f"error event(s) in the stream: {errors!r}"
        last = objs[-1]
        assert last["choices"] == [] and isinstance(last.get("usage"), dict), (
            f"the event before [DONE] should be the usage chunk: {last!r}"
        )
        ids = {o["id"] for o in objs}
        assert len(ids) == 1, f"chunks of one stream should share one id: {ids!r}"
        return f"{len(events)} events"

    checks.run("chat non-streaming (greedy): content, finish_reason, usage", chat_nonstream)
    checks.run("chat repeated → prefix cache hit (cached_tokens > 0)", chat_repeat_cached)
    checks.run("chat streaming + include_usage == non-streaming text", chat_stream)
    checks.run("chat streaming raw SSE ends with usage chunk then [DONE]", chat_stream_raw)

    # ---- completions --------------------------------------------------------------------------

    def completion_nonstream():
        r = client.completions.create(model=model, prompt=COMPLETION_PROMPT, temperature=0,
                                      max_tokens=MAX_TOKENS)
        assert r.object == "text_completion", f"object should be 'text_completion': {r.object!r}"
        assert len(r.choices) == 1, f"expected 1 choice, got {len(r.choices)}"
        c = r.choices[0]
        assert isinstance(c.text, str) and c.text, f"text should be non-empty: {c.text!r}"
        assert c.finish_reason in ("stop", "length"), f"finish_reason: {c.finish_reason!r}"
        cached = usage_ok(r.usage, "completion", MAX_TOKENS)
        state["completion_text"] = c.text
        state["completion_usage"] = r.usage
        return f"{r.usage.completion_tokens} tokens, cached {cached}, text {c.text!r}"

    def completion_stream():
        stream = client.completions.create(
            model=model, prompt=COMPLETION_PROMPT, temperature=0, max_tokens=MAX_TOKENS,
            stream=True, stream_options={"include_usage": True})
        pieces, finishes, usages = [], [], []
        for chunk in stream:
            if chunk.usage is not None:
                assert chunk.choices == [], f"usage chunk has choices: {chunk.choices!r}"
                usages.append(chunk.usage)
                continue
            assert len(chunk.choices) == 1, f"a text chunk has {len(chunk.choices)} choices"
            pieces.append(chunk.choices[0].text or "")
            if chunk.choices[0].finish_reason is not None:
                finishes.append(chunk.choices[0].finish_reason)
        text = "".join(pieces)
        assert len(usages) == 1, f"expected exactly one usage chunk, got {len(usages)}"
        assert len(finishes) == 1 and finishes[0] in ("stop", "length"), (
            f"expected one finish_reason chunk, got {finishes!r}"
        )
        usage_ok(usages[0], "completion stream usage chunk", MAX_TOKENS)
        if "completion_text" in state:
            assert text == state["completion_text"], (
                f"streamed text != non-streamed greedy text:\n  stream:     {text!r}\n"
                f"  non-stream: {state['completion_text']!r}"
            )
        ctype, events = raw.sse("/v1/completions", {
            "model": model, "prompt": COMPLETION_PROMPT, "temperature": 0,
            "max_tokens": MAX_TOKENS, "stream": True})
        assert ctype.startswith("text/event-stream"), f"content-type: {ctype!r}"
        assert events and events[-1] == "[DONE]", f"stream should end with [DONE]: {events[-3:]!r}"
        objs = [json.loads(e) for e in events[:-1]]
        assert all(o["choices"] for o in objs), (
            "without include_usage no chunk should have empty choices (no usage chunk)"
        )
        return f"{len(pieces)} chunks"

    checks.run("completions non-streaming (prompt string, greedy)", completion_nonstream)
    checks.run("completions streaming == non-streaming text; [DONE]", completion_stream)

    # ---- stop strings, max_tokens -------------------------------------------------------------

    def stop_string():
        first = client.completions.create(model=model, prompt=STOP_PROMPT, temperature=0,
                                          max_tokens=16)
        text = first.choices[0].text
        stop, idx = pick_stop(text)
        assert stop is not None, f"cannot pick a stop string from the greedy output {text!r}"
        r = client.completions.create(model=model, prompt=STOP_PROMPT, temperature=0,
                                      max_tokens=16, stop=[stop])
        got = r.choices[0].text
        assert stop not in got, f"output still contains the stop string {stop!r}: {got!r}"
        assert got == text[:idx], (
            f"with stop={[stop]!r} the output should be the greedy text cut before it:\n"
            f"  expected {text[:idx]!r}\n  got      {got!r}\n  (greedy  {text!r})"
        )
        assert r.choices[0].finish_reason == "stop", (
            f"finish_reason should be 'stop' when a stop string matched: "
            f"{r.choices[0].finish_reason!r}"
        )
        # the same through the stream: no piece of the stop string may leak out
        stream = client.completions.create(model=model, prompt=STOP_PROMPT, temperature=0,
                                           max_tokens=16, stop=[stop], stream=True)
        chunks = list(stream)
        streamed = "".join(c.choices[0].text or "" for c in chunks if c.choices)
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices
                   and c.choices[0].finish_reason]
        assert streamed == text[:idx], (
            f"streamed with stop={[stop]!r}: expected {text[:idx]!r}, got {streamed!r}"
        )
        assert reasons == ["stop"], f"streamed finish_reason(s) with a stop string: {reasons!r}"
        # chat too: a stop string from the chat greedy output
        chat_text = state.get("chat_text", "")
        cstop, cidx = pick_stop(chat_text)
        if cstop is not None:
            rc = client.chat.completions.create(model=model, messages=CHAT_MESSAGES,
                                                temperature=0, max_tokens=MAX_TOKENS,
                                                stop=cstop)
            assert rc.choices[0].message.content == chat_text[:cidx], (
                f"chat with stop={cstop!r}: expected {chat_text[:cidx]!r}, got "
                f"{rc.choices[0].message.content!r}"
            )
            assert rc.choices[0].finish_reason == "stop", (
                f"chat finish_reason with a stop string: {rc.choices[0].finish_reason!r}"
            )
        return f"stop {stop!r} at {idx} of {text!r}"

    def max_tokens_one():
        r = client.completions.create(model=model, prompt=COMPLETION_PROMPT, temperature=0,
                                      max_tokens=1)
        assert r.choices[0].finish_reason == "length", (
            f"max_tokens=1: finish_reason should be 'length': {r.choices[0].finish_reason!r}"
        )
        assert r.usage.completion_tokens == 1, (
            f"max_tokens=1: usage.completion_tokens should be 1: {r.usage.completion_tokens}"
        )
        rc = client.chat.completions.create(model=model, messages=CHAT_MESSAGES,
                                            temperature=0, max_tokens=1)
        assert rc.choices[0].finish_reason == "length", (
            f"chat max_tokens=1: finish_reason: {rc.choices[0].finish_reason!r}"
        )
        assert rc.usage.completion_tokens == 1, (
            f"chat max_tokens=1: completion_tokens {rc.usage.completion_tokens}"
        )
        return None

    checks.run("stop strings cut the output before the stop string, finish 'stop'", stop_string)
    checks.run("max_tokens=1 → finish 'length', completion_tokens 1", max_tokens_one)

    # ---- errors -------------------------------------------------------------------------------

    def expect_error(exc_cls, status, fn, where):
        try:
            fn()
        except exc_cls as e:
            assert e.status_code == status, f"{where}: HTTP {e.status_code}, expected {status}"
            body = e.response.json()
            return assert_error_shape(body, status, where)
        except openai.APIStatusError as e:
            raise AssertionError(
                f"{where}: expected {exc_cls.__name__} (HTTP {status}), got "
                f"{type(e).__name__} (HTTP {e.status_code}): {e.response.text[:300]}")
        raise AssertionError(f"{where}: the request succeeded; expected HTTP {status}")

    def wrong_key():
        assert args.api_key, "no API key given (argv or KVRUN_API_KEY): cannot test a wrong one"
        bad = openai.OpenAI(base_url=root + "/v1", api_key=args.api_key + "-wrong",
                            max_retries=0, timeout=60)
        err = expect_error(openai.AuthenticationError, 401, lambda: bad.chat.completions.create(
            model=model, messages=CHAT_MESSAGES, max_tokens=1), "wrong API key")
        status, _, data = raw.request("GET", "/v1/models", auth=False)
        assert status == 401, f"GET /v1/models without a key: expected 401, got {status}"
        assert_error_shape(json.loads(data), 401, "no API key")
        return f"type {err['type']!r}"

    def over_context():
        max_len = state["max_model_len"]
        prompt = "hello world " * (max_len + 8)
        tok = raw.json("POST", "/tokenize", {"model": model, "prompt": prompt})
        n = tok["count"]
        assert n > max_len, f"the test prompt has {n} tokens, not more than {max_len}"
        err = expect_error(openai.BadRequestError, 400, lambda: client.completions.create(
            model=model, prompt=prompt, max_tokens=4), "prompt over the context")
        msg = err["message"]
        assert str(n) in msg and str(max_len) in msg, (
            f"the message should name the prompt length {n} and the context {max_len}: {msg!r}"
        )
        # the chat endpoint refuses it too
        expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=4),
            "chat prompt over the context")
        return msg

    def n_three():
        def cache():
            f, _ = scrape(raw)
            return (sample_value(f, "kvrun:prefix_cache_hits", "kvrun:prefix_cache_hits_total"),
                    sample_value(f, "kvrun:prefix_cache_queries",
                                 "kvrun:prefix_cache_queries_total"))
        # a prompt no earlier check sent: its blocks are computed by this request's first choice
        prompt = COMPLETION_PROMPT + " a fox named n_three"
        hits0, queries0 = cache()
        r = client.completions.create(model=model, prompt=prompt, max_tokens=MAX_TOKENS,
                                      temperature=1.0, seed=11, n=3)
        hits, queries = cache()
        assert [c.index for c in r.choices] == [0, 1, 2], r
        assert all(c.finish_reason in ("stop", "length") for c in r.choices), r
        assert len({c.text for c in r.choices}) > 1, f"three samples, all the same: {r}"
        p = r.usage.prompt_tokens
        assert queries - queries0 == 3 * p, f"three lookups of the {p}-token prompt: {queries - queries0}"
        # the other two choices find the first one's full blocks of the prompt (16 tokens each)
        assert hits - hits0 >= 2 * (p - 16), f"the choices share the prompt: hits {hits - hits0}"
        if all(c.finish_reason == "length" for c in r.choices):
            assert r.usage.completion_tokens == 3 * MAX_TOKENS, f"added up: {r.usage}"
        assert r.usage.prompt_tokens == p, "the prompt counted once"
        # chat, streamed: each chunk names its choice, each choice ends once
        stream = client.chat.completions.create(model=model, messages=CHAT_MESSAGES,
                                                max_tokens=4, temperature=1.0, seed=3, n=3,
                                                stream=True)
        texts, ends = ["", "", ""], [0, 0, 0]
        for c in stream:
            for ch in c.choices:
                texts[ch.index] += ch.delta.content or ""
                ends[ch.index] += ch.finish_reason is not None
        assert ends == [1, 1, 1], ends
        expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(
            model=model, messages=CHAT_MESSAGES, max_tokens=2, n=0), "n=0")
        return f"prefix-cache hits {hits - hits0:.0f} of {queries - queries0:.0f} looked up"

    def unknown_model():
        err = expect_error(openai.NotFoundError, 404, lambda: client.chat.completions.create(
            model=model + "-does-not-exist", messages=CHAT_MESSAGES, max_tokens=2),
            "unknown model")
        expect_error(openai.NotFoundError, 404, lambda: client.completions.create(
            model=model + "-does-not-exist", prompt="hi", max_tokens=2),
            "unknown model (completions)")
        return f"type {err['type']!r}"

    def invalid_json():
        for path in ("/v1/chat/completions", "/v1/completions"):
            status, headers, data = raw.request("POST", path, b'{"model": "x", "messages": [}')
            assert status == 400, f"POST {path} with invalid JSON: HTTP {status}: {data[:300]!r}"
            assert headers.get("content-type", "").startswith("application/json"), (
                f"POST {path} invalid JSON: content-type {headers.get('content-type')!r}"
            )
            assert_error_shape(json.loads(data), 400, f"POST {path} with invalid JSON")
        return None

    def negative_temperature():
        err = expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(
            model=model, messages=CHAT_MESSAGES, max_tokens=2, temperature=-1),
            "temperature -1")
        expect_error(openai.BadRequestError, 400, lambda: client.completions.create(
            model=model, prompt="hi", max_tokens=2, temperature=-1),
            "temperature -1 (completions)")
        return f"param {err['param']!r}"

    checks.run("wrong API key → 401 AuthenticationError", wrong_key)
    checks.run("prompt over max_model_len → 400 naming both numbers", over_context)
    checks.run("n=3: three sampled choices sharing the prompt's KV blocks, streamed by index; "
               "n=0 → 400", n_three)
    checks.run("unknown model → 404 NotFoundError", unknown_model)
    checks.run("invalid JSON body (raw) → 400 with the error shape", invalid_json)
    checks.run("temperature -1 → 400 BadRequestError", negative_temperature)

    def unknown_role():
        err = expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(
            model=model, messages=[{"role": "wizard", "content": "hi"}], max_tokens=2),
            "role wizard")
        assert err["param"] == "messages", f"param {err['param']!r}"
        return err["message"]

    def max_tokens_beyond_context():
        err = expect_error(openai.BadRequestError, 400, lambda: client.completions.create(
            model=model, prompt="hi", max_tokens=10**12), "max_tokens 10^12")
        assert err["param"] == "max_tokens", f"param {err['param']!r}"
        return err["message"]

    checks.run("an unknown message role → 400 naming messages", unknown_role)
    checks.run("max_tokens beyond the context → 400 naming max_tokens", max_tokens_beyond_context)

    # ---- sampling controls --------------------------------------------------------------------

    def chat_logprobs():
        r = client.chat.completions.create(model=model, messages=CHAT_MESSAGES, temperature=0,
                                           max_tokens=MAX_TOKENS, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        assert len(content) == r.usage.completion_tokens, (
            f"{len(content)} logprob entries for {r.usage.completion_tokens} tokens")
        for e in content:
            tops = [t.logprob for t in e.top_logprobs]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True), f"tops {tops}"
            assert e.logprob <= 0 and abs(e.logprob - tops[0]) < 1e-4, (
                f"greedy: the chosen token ({e.logprob}) is the likeliest ({tops[0]})")
            assert bytes(e.bytes) == e.token.encode(), "bytes are the token's UTF-8"
        # streamed, the same entries
        stream = client.chat.completions.create(model=model, messages=CHAT_MESSAGES,
                                                temperature=0, max_tokens=MAX_TOKENS,
                                                logprobs=True, top_logprobs=3, stream=True)
        streamed = [e for c in stream if c.choices and c.choices[0].logprobs
                    for e in c.choices[0].logprobs.content]
        assert [e.logprob for e in streamed] == [e.logprob for e in content], "streamed logprobs"
        return f"{len(content)} tokens"

    def completion_logprobs():
        r = client.completions.create(model=model, prompt=COMPLETION_PROMPT, temperature=0,
                                      max_tokens=MAX_TOKENS, logprobs=2)
        lp = r.choices[0].logprobs
        assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
        text = r.choices[0].text
        if "\ufffd" not in text and not any("\ufffd" in t for t in lp.tokens):
            # (a token holding part of a character shows as U+FFFD on its own)
            assert "".join(lp.tokens) == text, "tokens join to the text"
        assert all(len(t) <= 2 for t in lp.top_logprobs)
        assert lp.text_offset == sorted(lp.text_offset)
        # echo (how evaluation harnesses score a text): the prompt's tokens first, the first
        # without a log-probability, then the answer's
        e = client.completions.create(model=model, prompt=COMPLETION_PROMPT, temperature=0,
                                      max_tokens=1, logprobs=1, echo=True)
        elp = e.choices[0].logprobs
        assert e.choices[0].text.startswith(COMPLETION_PROMPT), e.choices[0].text
        assert len(elp.tokens) == e.usage.prompt_tokens + 1, (len(elp.tokens), e.usage)
        assert elp.token_logprobs[0] is None and elp.top_logprobs[0] is None
        assert all(v <= 0 for v in elp.token_logprobs[1:]), elp.token_logprobs
        assert elp.token_logprobs[-1] == lp.token_logprobs[0], "the answer's first token agrees"
        return f"{len(lp.tokens)} tokens; echoed {e.usage.prompt_tokens} prompt tokens"

    def penalties_and_bias():
        plain = client.completions.create(model=model, prompt=COMPLETION_PROMPT, temperature=0,
                                          max_tokens=MAX_TOKENS)
        pen = client.completions.create(model=model, prompt=COMPLETION_PROMPT, temperature=0,
                                        max_tokens=MAX_TOKENS, frequency_penalty=2.0,
                                        presence_penalty=2.0,
                                        extra_body={"repetition_penalty": 1.5, "min_p": 0.05})
        assert pen.usage.completion_tokens == MAX_TOKENS
        # a bias of +100 on one token makes it the whole answer
        tok = raw.json("POST", "/tokenize", {"model": model, "prompt": "the", "add_special_tokens": False})
        t = tok["tokens"][0]
        biased = client.completions.create(model=model, prompt=COMPLETION_PROMPT, temperature=0,
                                           max_tokens=4, logit_bias={str(t): 100})
        one = raw.json("POST", "/detokenize", {"model": model, "tokens": [t]})["prompt"]
        assert biased.choices[0].text == one * 4, f"{biased.choices[0].text!r} vs 4 × {one!r}"
        # the same token as a stop token id: the answer ends at once, without its text
        stopped = client.completions.create(model=model, prompt=COMPLETION_PROMPT, temperature=0,
                                            max_tokens=4, logit_bias={str(t): 100},
                                            extra_body={"stop_token_ids": [t]})
        assert stopped.choices[0].finish_reason == "stop", stopped
        assert stopped.choices[0].text == "" and stopped.usage.completion_tokens == 1, stopped
        expect_error(openai.BadRequestError, 400, lambda: client.completions.create(
            model=model, prompt="hi", max_tokens=2, presence_penalty=5), "presence_penalty 5")
        changed = pen.choices[0].text != plain.choices[0].text
        return f"penalties changed the greedy text: {changed}"

    checks.run("chat logprobs + top_logprobs: one entry a token, sorted, streamed the same",
               chat_logprobs)
    checks.run("completions logprobs: tokens, offsets, alternatives; echo scores the prompt",
               completion_logprobs)
    checks.run("penalties and min_p accepted, logit_bias forces a token, stop_token_ids ends "
               "on it, bad penalty → 400",
               penalties_and_bias)

    # ---- structured outputs and tool calls ----------------------------------------------------

    short = [{"role": "user", "content": "Weather?"}]  # the tiny model's context is 256 bytes
    person = {"type": "object",
              "properties": {"name": {"type": "string", "maxLength": 8},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}

    def json_schema_output():
        r = client.chat.completions.create(
            model=model, messages=short, temperature=0, max_tokens=120,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "person", "schema": person, "strict": True}})
        assert r.choices[0].finish_reason == "stop", r
        value = json.loads(r.choices[0].message.content)
        jsonschema.validate(value, person)

        # the SDK's own structured parsing, into a Pydantic model
        class Person(pydantic.BaseModel):
            name: str = pydantic.Field(max_length=8)
            age: int = pydantic.Field(ge=0, le=120)

        parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
        parsed = parse(model=model, messages=short, temperature=0, max_tokens=120,
                       response_format=Person).choices[0].message.parsed
        assert isinstance(parsed, Person), parsed
        # vLLM's structured_outputs: a choice
        colors = ["red", "green", "blue"]
        c = client.chat.completions.create(model=model, messages=short, temperature=0.7,
                                           seed=5, max_tokens=8,
                                           extra_body={"structured_outputs": {"choice": colors}})
        assert c.choices[0].message.content in colors, c
        expect_error(openai.BadRequestError, 400, lambda: client.chat.completions.create(
            model=model, messages=short, max_tokens=4,
            extra_body={"structured_outputs": {"regex": "(unclosed"}}), "bad regex")
        return f"{value}, {parsed!r}, {c.choices[0].message.content!r}"

    weather = {"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object",
                       "properties": {"city": {"type": "string", "maxLength": 8},
                                      "unit": {"enum": ["celsius", "fahrenheit"]}},
                       "required": ["city", "unit"], "additionalProperties": False}}}

    def tool_choice_required():
        r = client.chat.completions.create(model=model, messages=short, temperature=0,
                                           max_tokens=150, tools=[weather],
                                           tool_choice="required")
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", r
        call = choice.message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather", call
        args = json.loads(call.function.arguments)
        jsonschema.validate(args, weather["function"]["parameters"])
        # streamed: the tool_calls deltas add up to the same call
        stream = client.chat.completions.create(
            model=model, messages=short, temperature=0, max_tokens=150, tools=[weather],
            tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True)
        name, arguments, finish = "", "", None
        for chunk in stream:
            if not chunk.choices:
                continue
            for d in chunk.choices[0].delta.tool_calls or []:
                name += d.function.name or ""
                arguments += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        assert (name, finish) == ("get_weather", "tool_calls"), (name, finish)
        assert json.loads(arguments) == args, (arguments, args)
        return f"get_weather({call.function.arguments})"

    checks.run("response_format json_schema → valid JSON; the SDK's parse(); a choice; a bad "
               "regex → 400", json_schema_output)
    checks.run("tool_choice required / named → a call whose arguments follow the schema, "
               "streamed the same", tool_choice_required)

    # ---- tokenizer ----------------------------------------------------------------------------

    def tokenize_roundtrip():
        text = "Hello, world! The quick brown fox."
        tok = raw.json("POST", "/tokenize",
                       {"model": model, "prompt": text, "add_special_tokens": False})
        tokens = tok.get("tokens")
        assert isinstance(tokens, list) and tokens and all(isinstance(t, int) for t in tokens), (
            f"/tokenize: tokens should be a non-empty list of ints: {tok!r}"
        )
        assert tok.get("count") == len(tokens), f"/tokenize: count != len(tokens): {tok!r}"
        assert tok.get("max_model_len") == state["max_model_len"], (
            f"/tokenize: max_model_len {tok.get('max_model_len')} != /v1/models "
            f"{state['max_model_len']}"
        )
        de = raw.json("POST", "/detokenize", {"model": model, "tokens": tokens})
        assert de.get("prompt") == text, (
            f"/detokenize(/tokenize(text)) != text: {de.get('prompt')!r} vs {text!r}"
        )
        status, _, data = raw.request("POST", "/detokenize", {"tokens": [10 ** 9]})
        assert status == 400, f"/detokenize of an id outside the vocabulary: HTTP {status}"
        assert_error_shape(json.loads(data), 400, "/detokenize bad id")
        return f"{len(tokens)} tokens"

    checks.run("/tokenize → /detokenize round trip", tokenize_roundtrip)

    # ---- metrics ------------------------------------------------------------------------------

    def metrics_families():
        families, ctype = scrape(raw)
        assert ctype.startswith("application/openmetrics-text"), f"content-type {ctype!r}"
        want = {
            "kvrun:num_requests_running": "gauge",
            "kvrun:num_requests_waiting": "gauge",
            "kvrun:kv_cache_usage_perc": "gauge",
            "kvrun:prefix_cache_queries": "counter",
            "kvrun:prefix_cache_hits": "counter",
            "kvrun:time_to_first_token_seconds": "histogram",
            "kvrun:cache_config_info": "gauge",
            "kvrun:request_disconnects": "counter",
            "kvrun:prompt_tokens": "counter",
        }
        wrong = {n: (families[n].type if n in families else None) for n, t in want.items()
                 if n not in families or families[n].type != t}
        assert not wrong, (
            f"families missing or of the wrong type (name: type found): {wrong}; "
            f"expected {want}"
        )
        info = [s for s in families["kvrun:cache_config_info"].samples]
        assert len(info) == 1 and {"block_size", "num_gpu_blocks"} <= set(info[0].labels), (
            f"kvrun:cache_config_info should have one sample with labels block_size, "
            f"num_gpu_blocks: {info!r}"
        )
        for label in ("block_size", "num_gpu_blocks"):
            assert info[0].labels[label].isdigit() and int(info[0].labels[label]) > 0, (
                f"cache_config_info label {label}={info[0].labels[label]!r} is not a positive int"
            )
        hits = sample_value(families, "kvrun:prefix_cache_hits", "kvrun:prefix_cache_hits_total")
        queries = sample_value(families, "kvrun:prefix_cache_queries",
                               "kvrun:prefix_cache_queries_total")
        if state.get("cache_hit_seen"):
            assert hits > 0, f"kvrun:prefix_cache_hits_total is {hits} after a cache hit"
        assert hits <= queries, f"prefix cache hits {hits} > queries {queries}"
        usage = sample_value(families, "kvrun:kv_cache_usage_perc", "kvrun:kv_cache_usage_perc")
        assert 0.0 <= usage <= 1.0, f"kvrun:kv_cache_usage_perc {usage} outside [0, 1]"
        inf = sample_value(families, "kvrun:time_to_first_token_seconds",
                           "kvrun:time_to_first_token_seconds_bucket", {"le": "+Inf"})
        count = sample_value(families, "kvrun:time_to_first_token_seconds",
                             "kvrun:time_to_first_token_seconds_count")
        assert inf == count > 0, f"TTFT histogram: +Inf bucket {inf}, count {count}"
        return (f"{len(families)} families; prefix cache {hits:g}/{queries:g} tokens hit; "
                f"cache_config_info {info[0].labels}")

    def metrics_prompt_tokens():
        before, _ = scrape(raw)
        b = sample_value(before, "kvrun:prompt_tokens", "kvrun:prompt_tokens_total")
        r = client.completions.create(model=model, prompt=COMPLETION_PROMPT + " metrics",
                                      temperature=0, max_tokens=2)
        after, _ = scrape(raw)
        a = sample_value(after, "kvrun:prompt_tokens", "kvrun:prompt_tokens_total")
        assert a > b, f"kvrun:prompt_tokens_total did not increase around a request: {b} → {a}"
        assert a - b >= r.usage.prompt_tokens, (
            f"kvrun:prompt_tokens_total grew by {a - b:g}, less than the request's "
            f"prompt_tokens {r.usage.prompt_tokens}"
        )
        return f"{b:g} → {a:g} (request prompt_tokens {r.usage.prompt_tokens})"

    checks.run("GET /metrics: strict OpenMetrics, families and types", metrics_families)
    checks.run("GET /metrics: prompt_tokens counter grows around a request", metrics_prompt_tokens)

    print(f"{checks.passed} passed, {checks.failed} failed")
    return 0 if checks.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
