"""Admission under bursts: the waiting count is taken when a request is accepted, so a burst of
300 simultaneous requests admits exactly what the limits allow and answers the rest 429 with
Retry-After, in OpenAI's error shape; --max-queued-tokens bounds queued prompt tokens the same way."""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytestmark = pytest.mark.reliability


async def burst(base_url: str, count: int, prompt: list[int], max_tokens: int) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, timeout=120, limits=limits) as client:
        body = {"model": "fake", "prompt": prompt, "max_tokens": max_tokens}
        return await asyncio.gather(*(client.post("/v1/completions", json=body) for _ in range(count)))


@pytest.mark.parametrize("rounds", [1])
def test_a_burst_of_300_admits_max_num_seqs_plus_max_waiting(start_fake, tally, long_run, rounds):
    proc = start_fake("--max-num-seqs", "4", "--max-waiting-requests", "8", "--step-seconds", "0.05")
    for _ in range(3 if long_run else rounds):
        responses = asyncio.run(burst(proc.base_url, 300, [5, 6, 7], 100))  # each runs ~5 s
        statuses = [r.status_code for r in responses]
        for r in responses:
            tally.response("completed" if r.status_code == 200 else f"HTTP {r.status_code} (admission)", text=r.text)
        assert statuses.count(200) == 4 + 8, sorted(set(statuses))
        assert statuses.count(429) == 300 - 12
        rejected = next(r for r in responses if r.status_code == 429)
        assert rejected.headers["retry-after"] == "1"
        assert rejected.json()["error"]["code"] == "server_overloaded"


def test_max_queued_tokens_bounds_the_prompt_tokens_waiting(start_fake, tally):
    proc = start_fake("--max-num-seqs", "1", "--max-queued-tokens", "100", "--step-seconds", "0.2")
    responses = asyncio.run(burst(proc.base_url, 10, list(range(10, 50)), 10))  # 40 tokens each
    statuses = [r.status_code for r in responses]
    for r in responses:
        tally.response("completed" if r.status_code == 200 else f"HTTP {r.status_code} (admission)", text=r.text)
    assert statuses.count(200) == 2 and statuses.count(429) == 8  # 40 + 40 queued; an 80 + 40 > 100
    assert "--max-queued-tokens" in next(r for r in responses if r.status_code == 429).json()["error"]["message"]
