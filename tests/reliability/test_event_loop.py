"""The event loop never waits on client input: while a worst-case request of each kind runs, a
concurrent short request's median latency stays within 2x its median on the idle server. The
worst cases are the ones issue #11 found stalling every client: a long prompt to tokenize, the
most and longest stop strings, a hostile request chat template (allowed here, so it runs in the
sandbox), and a huge conversation for the model's own template."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest

pytestmark = pytest.mark.reliability

LONG_PROMPT = ("the quick brown fox jumps over the lazy dog; " * 12_000)[:499_000]
WORST = {
    "long prompt": ("/v1/completions", {"prompt": LONG_PROMPT, "max_tokens": 1}),
    "16 stop strings of 256 characters": (
        "/v1/completions",
        {
            "prompt": "a b c d",
            "max_tokens": 120,
            "stream": True,
            "stop": [("zq" * 128)[:255] + str(i % 10) for i in range(16)],
        },
    ),
    "hostile request chat template": (
        "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1,
            "chat_template": "{% for i in range(10**9) %}{{ i }}{% endfor %}",
        },
    ),
    "huge conversation": (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "word " * 400}] * 1000, "max_tokens": 1},
    ),
}


def short_latencies(base_url: str, count: int) -> list[float]:
    latencies = []
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for _ in range(count):
            started = time.perf_counter()
            response = client.post("/v1/completions", json={"model": "fake", "prompt": [5, 6], "max_tokens": 1})
            assert response.status_code == 200, response.text
            latencies.append(time.perf_counter() - started)
    return latencies


def keep_sending(base_url: str, route: str, body: dict, stop: threading.Event, statuses: list[int]) -> None:
    with httpx.Client(base_url=base_url, timeout=120) as client:
        while not stop.is_set():
            statuses.append(client.post(route, json={"model": "fake", **body}).status_code)


@pytest.mark.parametrize("kind", WORST)
def test_a_short_request_stays_fast_while_a_worst_case_request_runs(start_fake, tally, kind):
    proc = start_fake(
        "--trust-request-chat-template",
        "--max-request-body-bytes",
        str(8 << 20),
        "--max-num-seqs",
        "8",
        "--step-seconds",
        "0.01",
    )
    idle = statistics.median(short_latencies(proc.base_url, 30))
    route, body = WORST[kind]
    stop, statuses = threading.Event(), []
    sender = threading.Thread(target=keep_sending, args=(proc.base_url, route, body, stop, statuses))
    sender.start()
    time.sleep(0.3)
    try:
        loaded = short_latencies(proc.base_url, 30)
    finally:
        stop.set()
        sender.join(120)
    tally.latencies += loaded
    tally.rows.append(
        (
            f"short request p50 while '{kind}' runs",
            f"{statistics.median(loaded) * 1000:.1f} ms (idle {idle * 1000:.1f} ms)",
        )
    )
    assert statuses and all(s in (200, 400) for s in statuses), statuses  # the worst case itself: served or a 400
    assert statistics.median(loaded) <= 2 * idle, (kind, idle, statistics.median(loaded))
