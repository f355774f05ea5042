"""Many clients at once, and clients that leave, on the real model; checked through /metrics."""

from __future__ import annotations

import asyncio

import openai
import pytest
from conftest import API_KEY, SERVED_NAME
from server_process import wait_for

pytestmark = pytest.mark.slow  # the real SmolLM2 server (session fixture)

PROMPTS = ["Tell me a fact about the sea.", "Name a color.", "What is 2 + 2?", "Say hello."]


def test_32_concurrent_streams_all_complete_and_the_engine_ends_idle(server):
    async def one(api: openai.AsyncOpenAI, i: int) -> tuple[str, str | None, int]:
        stream = await api.chat.completions.create(
            model=SERVED_NAME,
            messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
            max_tokens=24,
            temperature=0.8,
            seed=i,
            stream=True,
        )
        text, finish, pieces = "", None, 0
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                pieces += bool(chunk.choices[0].delta.content)
                finish = chunk.choices[0].finish_reason or finish
        return text, finish, pieces

    async def run() -> list[tuple[str, str | None, int]]:
        async with openai.AsyncOpenAI(
            base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=300
        ) as api:
            return await asyncio.gather(*(one(api, i) for i in range(32)))

    results = asyncio.run(run())
    assert all(finish in ("stop", "length") for _, finish, _ in results)
    assert all(text for text, _, _ in results)
    metrics = wait_for(lambda: (m := server.metrics())["ortserve:num_requests_running"] == 0 and m, timeout=15)
    assert metrics["ortserve:num_requests_waiting"] == 0
    assert metrics["ortserve:kv_cache_usage_perc"] == 0
    assert metrics["ortserve:time_to_first_token_seconds_count"] >= 32
    assert metrics["ortserve:e2e_request_latency_seconds_count"] >= 32
    # 32 requests over 4 prompts that share the chat template's system prompt
    assert 0 < metrics["ortserve:prefix_cache_hits_total"] <= metrics["ortserve:prefix_cache_queries_total"]
    # the engine's own time: at least a step per token of the longest stream (a token a step, and a
    # piece of text holds one token or more), the model's run a part of the steps' time
    assert metrics["ortserve:engine_steps_total"] >= max(pieces for _, _, pieces in results) > 0
    assert 0 < metrics["ortserve:model_run_seconds_total"] < metrics["ortserve:engine_step_seconds_total"]


def test_a_client_that_leaves_mid_stream_is_aborted(server):
    before = server.metrics()
    api = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0)
    stream = api.completions.create(
        model=SERVED_NAME,
        prompt="Write a very long story.",
        max_tokens=900,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _, _chunk in zip(range(5), stream):
        pass
    stream.close()  # the client goes away after 5 tokens
    after = wait_for(
        lambda: (
            (m := server.metrics())["ortserve:request_success_total{abort}"]
            > before["ortserve:request_success_total{abort}"]
            and m["ortserve:num_requests_running"] == 0
            and m
        ),
        timeout=15,
    )
    assert after["ortserve:kv_cache_usage_perc"] == 0
    generated = after["ortserve:generation_tokens_total"] - before["ortserve:generation_tokens_total"]
    assert generated < 200  # far from the 900 it asked for
