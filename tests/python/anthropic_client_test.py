#!/usr/bin/env python3
"""End-to-end check of `kvrun serve`'s `/v1/messages` with the official `anthropic` client.

Usage:
    python3 tests/python/anthropic_client_test.py BASE_URL API_KEY MODEL

Run by tests/openai_python.rs against the tiny model (its tokens are bytes, its context 256).
Prints one line per check and exits 1 when any failed.
"""

import json
import sys
import time
import urllib.error
import urllib.request

import anthropic
import jsonschema


def main():
    base, key, model = sys.argv[1], sys.argv[2], sys.argv[3]
    client = anthropic.Anthropic(base_url=base, api_key=key, max_retries=0)
    for _ in range(600):  # the server answers 503 while the model loads
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=5) as r:
                if r.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    failed = 0

    def check(name, fn):
        nonlocal failed
        try:
            detail = fn()
            print(f"ok    {name} ({detail})")
        except Exception as e:  # noqa: BLE001 - every failure is reported
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {e}")

    def plain():
        m = client.messages.create(model=model, max_tokens=8, extra_body={"temperature": 0}, system="Be brief.",
                                   messages=[{"role": "user", "content": "Hi"}])
        assert m.type == "message" and m.role == "assistant", m
        assert m.stop_reason in ("end_turn", "max_tokens"), m.stop_reason
        assert m.usage.output_tokens <= 8 and m.usage.input_tokens > 0, m.usage
        text = "".join(b.text for b in m.content if b.type == "text")
        # streamed with the SDK's helper: the same text, the same final message shape
        with client.messages.stream(model=model, max_tokens=8, extra_body={"temperature": 0}, system="Be brief.",
                                    messages=[{"role": "user", "content": "Hi"}]) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert streamed == text, (streamed, text)
        assert final.stop_reason == m.stop_reason, (final.stop_reason, m.stop_reason)
        counted = client.messages.count_tokens(model=model, system="Be brief.",
                                               messages=[{"role": "user", "content": "Hi"}])
        assert counted.input_tokens == m.usage.input_tokens, (counted, m.usage)
        return repr(text)

    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 4}},
              "required": ["city"], "additionalProperties": False}
    tool = {"name": "get_weather", "description": "Weather of a city", "input_schema": schema}

    def tools():
        m = client.messages.create(model=model, max_tokens=100, extra_body={"temperature": 0}, tools=[tool],
                                   tool_choice={"type": "tool", "name": "get_weather"},
                                   messages=[{"role": "user", "content": "Weather?"}])
        assert m.stop_reason == "tool_use", m
        use = next(b for b in m.content if b.type == "tool_use")
        assert use.name == "get_weather", use
        jsonschema.validate(use.input, schema)
        # the result goes back as the next turn
        m2 = client.messages.create(model=model, max_tokens=4, tools=[tool], messages=[
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": [b.model_dump() for b in m.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": "sunny"}]},
        ])
        assert m2.type == "message", m2
        return json.dumps(use.input)

    def errors():
        try:
            client.messages.create(model=model, max_tokens=4, messages=[
                {"role": "user", "content": [{"type": "image", "source": {
                    "type": "base64", "media_type": "image/png", "data": "AAAA"}}]}])
        except anthropic.BadRequestError as e:
            assert e.status_code == 400 and "image" in str(e), e
            return "image → 400"
        raise AssertionError("an image block was accepted")

    check("messages.create and messages.stream give the same text; count_tokens", plain)
    check("tool_choice tool → tool_use with schema-valid input; tool_result turn", tools)
    check("an image block → BadRequestError", errors)
    print(f"{3 - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
