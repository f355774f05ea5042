"""Load with random cancellations, then a soak, on a real engine (the tiny Llama artifact): every
request completes or was cancelled by its client, no response carries a traceback, the KV cache
is empty afterwards, and the server's memory stays flat over the soak."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from server_process import ServerProcess

pytestmark = pytest.mark.reliability


@pytest.fixture(scope="module")
def server(tiny_llama_artifact):
    proc = ServerProcess.real(
        tiny_llama_artifact,
        "--served-model-name",
        "tiny",
        "--threads-bind",
        "nobind",
        "--kv-cache-space",
        "0.1",
        "--max-model-len",
        "1024",
    )
    proc.wait_ready()
    yield proc
    proc.stop()


async def one_request(client: httpx.AsyncClient, rng: random.Random, tally) -> str:
    body = {
        "model": "tiny",
        "prompt": [rng.randrange(100, 40000) for _ in range(rng.randrange(4, 200))],
        "max_tokens": rng.randrange(1, 64),
        "temperature": rng.choice([0.0, 0.7, 1.3]),
        "stream": rng.random() < 0.5,
        "n": rng.choice([1, 1, 2]),
    }
    cancel_after = rng.uniform(0.01, 0.5) if rng.random() < 0.3 else None
    started = time.monotonic()
    try:
        async with asyncio.timeout(cancel_after) if cancel_after else asyncio.timeout(120):
            response = await client.post("/v1/completions", json=body)
            text = response.text
        failed = response.status_code != 200 or any("error" in event for event in events(text, body["stream"]))
        outcome = f"HTTP {response.status_code}" if failed else "completed"
        tally.response(outcome, time.monotonic() - started, text)
    except TimeoutError:
        outcome = "cancelled by the client" if cancel_after else "timed out"
        tally.response(outcome)
    return outcome


def events(text: str, stream: bool) -> list[dict]:
    """The response's JSON objects: the body, or each SSE event (a generated "error" is text, not one)."""
    if not stream:
        return [json.loads(text)]
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


async def load(base_url: str, count: int, concurrency: int, seed: int, tally) -> Counter[str]:
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:

        async def run() -> str:
            async with gate:
                return await one_request(client, rng, tally)

        return Counter(await asyncio.gather(*(run() for _ in range(count))))


def wait_idle(proc: ServerProcess) -> dict[str, float]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        metrics = proc.metrics()
        if metrics["ortserve:num_requests_running"] == 0 and metrics["ortserve:num_requests_waiting"] == 0:
            return metrics
        time.sleep(0.2)
    raise AssertionError("the engine did not go idle")


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_load_with_random_cancellations_leaks_nothing(server, tally, long_run):
    outcomes = asyncio.run(load(server.base_url, 600 if long_run else 40, 16, seed=1, tally=tally))
    metrics = wait_idle(server)
    tally.leaked_blocks.append(metrics["ortserve:kv_cache_usage_perc"])
    assert metrics["ortserve:kv_cache_usage_perc"] == 0.0
    assert tally.tracebacks == 0
    assert set(outcomes) <= {"completed", "cancelled by the client"} and outcomes["completed"], outcomes
    assert server.proc.poll() is None


def test_soak_keeps_memory_flat(server, tally, long_run):
    rounds = 10 if long_run else 2
    asyncio.run(load(server.base_url, 100, 8, seed=2, tally=tally))  # warm
    before = rss_kib(server.proc.pid)
    for i in range(rounds):
        asyncio.run(load(server.base_url, 100, 8, seed=10 + i, tally=tally))
    after = rss_kib(server.proc.pid)
    tally.rows.append(
        ("HTTP process RSS over the soak", f"{before / 1024:.0f} -> {after / 1024:.0f} MiB ({rounds * 100} requests)")
    )
    metrics = wait_idle(server)
    assert metrics["ortserve:kv_cache_usage_perc"] == 0.0
    assert after - before < 64 * 1024, (before, after)  # flat: no growth per request
