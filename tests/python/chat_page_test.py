#!/usr/bin/env python3
"""The chat page (`GET /`) in a real headless browser: Debian's chromium driven by selenium
through chromedriver.

Usage:
    python3 tests/python/chat_page_test.py BASE_URL API_KEY

Types a message, sends it, watches the reply stream in (the assistant bubble grows over several
polls before it is done) and the KV panel change (prompt tokens looked up; on the second turn,
which repeats the first turn's prompt as its prefix, tokens found in the prefix cache and the
reply's cached tokens). Exits 1 on failure.
"""

import sys
import time

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By


def wait(what, fn, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        value = fn()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def number(driver, id_):
    text = driver.find_element(By.ID, id_).text.split(" ")[0]
    return int(text) if text.isdigit() else None


def main():
    base, key = sys.argv[1], sys.argv[2]
    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    try:
        driver.get(base + "/")
        assert driver.title == "kvrun chat", driver.title
        driver.find_element(By.ID, "key").send_keys(key)
        driver.execute_script("localStorage.setItem('kvrun-key', arguments[0]); loadModel();", key)
        max_tokens = driver.find_element(By.ID, "max-tokens")
        max_tokens.clear()
        max_tokens.send_keys("24")
        model = wait("the model name", lambda: "·" in driver.find_element(By.ID, "model").text
                     and driver.find_element(By.ID, "model").text)
        wait("the KV panel", lambda: number(driver, "prefix-queries") is not None)
        queries0 = number(driver, "prefix-queries")

        lengths = []

        def turn(text, n):
            box = driver.find_element(By.ID, "input")
            box.send_keys(text)
            driver.find_element(By.ID, "send").click()
            bubbles = wait("the reply bubble", lambda: (
                lambda b: len(b) >= n and b)(driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")))
            reply = bubbles[n - 1]
            # the reply streams: its text is seen growing before it is done
            while reply.get_attribute("data-done") is None:
                lengths.append(len(reply.find_element(By.CSS_SELECTOR, "span:not(.thinking)").text))
                time.sleep(0.02)
            assert reply.get_attribute("data-done") == "1", reply.text
            return reply

        first = turn("Hello! Tell me a story.", 1)
        grew = sorted(set(lengths))
        assert len(grew) >= 3, f"the reply did not stream: lengths seen {grew}"
        wait("prompt tokens looked up", lambda: number(driver, "prefix-queries") > queries0)
        prompt1 = number(driver, "last-prompt")
        assert prompt1 and prompt1 > 0, driver.find_element(By.ID, "last-prompt").text

        second = turn("And then?", 2)
        assert second.text.strip(), "empty second reply"
        cached = wait("the second reply's cached tokens", lambda: number(driver, "last-cached"))
        assert cached > 0, "the second turn reused none of the first turn's prompt"
        hits = wait("prefix-cache hits", lambda: number(driver, "prefix-hits"))
        assert hits >= cached, (hits, cached)
        usage = driver.find_element(By.ID, "kv-pool").text
        assert "blocks" in usage, usage
        print(f"ok    chat page: {model}; first reply {len(first.text)} chars streamed in "
              f"{len(grew)} sizes; second turn {cached} cached tokens, {hits} prefix hits")
    finally:
        driver.quit()


if __name__ == "__main__":
    main()
