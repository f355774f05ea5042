"""--stream-interval and non-streaming requests over HTTP, through the official openai client: the
tiny Llama served with --stream-interval 4 streams its first token alone and then 4 tokens a
chunk, with the same text, tokens and logprobs as the shared tiny server (interval 1) sends one
token a chunk; /metrics counts every generated token although most steps send nothing."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from conftest import TINY_NAME, serve_tiny
from server_process import ServerProcess

INTERVAL = 4
PROMPT = "The quick brown fox jumps over the lazy dog"


@pytest.fixture(scope="module")
def held_server(tiny_llama_artifact: Path) -> Iterator[ServerProcess]:
    yield from serve_tiny(tiny_llama_artifact, "--stream-interval", str(INTERVAL))


def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def streamed(server: ServerProcess, max_tokens: int) -> list[tuple[str, list[str], str | None]]:
    """Each chunk with a choice: (text, its tokens per logprobs, finish reason)."""
    stream = client(server).completions.create(
        model=TINY_NAME,
        prompt=PROMPT,
        max_tokens=max_tokens,
        temperature=0,
        logprobs=1,
        extra_body={"ignore_eos": True},
        stream=True,
    )
    return [
        (c.choices[0].text, list(c.choices[0].logprobs.tokens or []), c.choices[0].finish_reason)
        for c in stream
        if c.choices
    ]


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 13])
def test_chunks_of_the_interval_carry_what_single_tokens_do(held_server, tiny_server, max_tokens):
    held, each = streamed(held_server, max_tokens), streamed(tiny_server, max_tokens)
    assert [len(tokens) for _, tokens, _ in each] == [1] * max_tokens
    sizes = [len(tokens) for _, tokens, _ in held]
    rest = max_tokens - 1
    assert sizes == [1] + [INTERVAL] * (rest // INTERVAL) + ([rest % INTERVAL] if rest % INTERVAL else [])
    assert "".join(t for t, _, _ in held) == "".join(t for t, _, _ in each)
    assert [t for _, tokens, _ in held for t in tokens] == [t for _, tokens, _ in each for t in tokens]
    assert held[-1][2] == each[-1][2] == "length"


def test_metrics_count_tokens_of_steps_that_sent_nothing(held_server):
    before = held_server.metrics()
    streamed(held_server, 13)
    whole = client(held_server).completions.create(
        model=TINY_NAME, prompt=PROMPT, max_tokens=11, temperature=0, extra_body={"ignore_eos": True}
    )
    after = held_server.metrics()
    assert whole.usage.completion_tokens == 11
    generated = after["ortserve:generation_tokens_total"] - before["ortserve:generation_tokens_total"]
    assert generated == 13 + 11
    assert after["ortserve:num_requests_running"] == 0
