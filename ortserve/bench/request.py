"""One streamed completion request, timed the way `vllm bench serve` times it.

The client is aiohttp, as in `vllm bench serve`: per streamed chunk it costs about 0.08 ms of
client CPU, against 0.18-0.19 ms for httpx (benchmarks/bench_client_cpu.py, tables/amd_epyc_zen4.md);
on a 2-core box that CPU is taken from the server under test.

Every server-sent event whose `choices` is non-empty counts as a token chunk (even with empty
text): the first sets TTFT, each later one appends an ITL gap, the last one ends E2EL. A final
`usage` event, when the server sends one, gives the exact prompt and completion token counts.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import aiohttp

from ortserve.bench.metrics import RequestResult

BACKENDS = ("openai", "llama.cpp")


@dataclass(frozen=True)
class RequestSpec:
    url: str
    model: str
    prompt: str
    prompt_len: int
    output_len: int
    backend: str = "openai"
    ignore_eos: bool = True
    extra_body: dict | None = None


def payload(spec: RequestSpec) -> dict:
    """The request body. ignore_eos and min_tokens both pin the length: servers honour one or both."""
    body = {
        "model": spec.model,
        "prompt": spec.prompt,
        "max_tokens": spec.output_len,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
        body["min_tokens"] = spec.output_len
    if spec.backend == "llama.cpp":
        # llama.cpp's own names: n_predict (native server), cache_prompt (slot prefix reuse).
        body["n_predict"] = spec.output_len
        body["cache_prompt"] = True
    if spec.extra_body:
        body.update(spec.extra_body)
    return body


def _events(line: str):
    """The JSON payload of one SSE line, or None for comments, blanks and [DONE]."""
    if not line.startswith("data:"):
        return None
    data = line[5:].strip()
    if not data or data == "[DONE]":
        return None
    return json.loads(data)


async def send(client: aiohttp.ClientSession, spec: RequestSpec, count_tokens=None) -> RequestResult:
    """Stream one request. count_tokens(text) -> int counts output tokens when usage is absent.

    A kept-alive connection the server closed just before reuse fails before any response byte
    (aiohttp.ServerDisconnectedError; aiohttp retries only idempotent methods itself, not POST);
    that attempt is retried once on a fresh connection, timed anew.
    """
    out = await _attempt(client, spec, count_tokens)
    if out.error.startswith("ServerDisconnectedError") and out.num_chunks == 0:
        out = await _attempt(client, spec, count_tokens)
    return out


async def _attempt(client: aiohttp.ClientSession, spec: RequestSpec, count_tokens) -> RequestResult:
    out = RequestResult(prompt_len=spec.prompt_len)
    st = time.perf_counter()
    out.start_time = last = st
    text: list[str] = []
    usage_tokens = None
    try:
        async with client.post(spec.url, json=payload(spec)) as response:
            if response.status != 200:
                body = (await response.read()).decode(errors="replace")
                out.error = f"HTTP {response.status}: {body[:500]}"
                return out
            async for line in response.content:  # one line per iteration
                event = _events(line.decode())
                if event is None:
                    continue
                if choices := event.get("choices"):
                    now = time.perf_counter()
                    if out.num_chunks == 0:
                        out.ttft = now - st
                    else:
                        out.itl.append(now - last)
                    last = now
                    out.num_chunks += 1
                    text.append(choices[0].get("text") or "")
                if usage := event.get("usage"):
                    usage_tokens = usage.get("completion_tokens")
                    if usage.get("prompt_tokens") is not None:
                        out.prompt_len = usage["prompt_tokens"]
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # ValueError: bad JSON, overlong line
        out.error = f"{type(exc).__name__}: {exc}"
        return out
    out.generated_text = "".join(text)
    out.latency = last - st
    if out.num_chunks == 0:
        out.error = "no streamed chunk carried a choice: nothing to time"
        return out
    if usage_tokens:
        out.output_tokens = usage_tokens
    elif count_tokens is not None:
        out.output_tokens = count_tokens(out.generated_text)
    else:
        out.output_tokens = out.num_chunks
    out.success = True
    return out
