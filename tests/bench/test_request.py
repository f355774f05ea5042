"""One streamed request against a scripted SSE server (aiohttp.web on 127.0.0.1): what is sent,
and how chunks become TTFT, ITL, E2EL and token counts."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket

import aiohttp
import pytest
from aiohttp import web

from ortserve.bench.request import RequestSpec, payload, send

SPEC = RequestSpec(url="http://127.0.0.1/v1/completions", model="m", prompt="hi", prompt_len=2, output_len=3)


async def sse(request: web.Request, events: list[dict | str], delay: float = 0.0) -> web.StreamResponse:
    response = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await response.prepare(request)
    for event in events:
        await asyncio.sleep(delay)
        data = event if isinstance(event, str) else json.dumps(event)
        await response.write(f"data: {data}\n\n".encode())
    await response.write_eof()
    return response


def serve(handler, count_tokens=None):
    """send(SPEC) against `handler` served on a free 127.0.0.1 port."""

    async def go():
        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))  # a free port, known before the site starts
        site = web.SockSite(runner, sock)
        await site.start()
        port = sock.getsockname()[1]
        spec = dataclasses.replace(SPEC, url=f"http://127.0.0.1:{port}/v1/completions")
        try:
            async with aiohttp.ClientSession() as client:
                return await send(client, spec, count_tokens)
        finally:
            await runner.cleanup()

    return asyncio.run(go())


def chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": None}]}


def run(events, delay=0.0, status=200, count_tokens=None, seen=None):
    async def handler(request: web.Request) -> web.StreamResponse:
        if seen is not None:
            seen.append(await request.json())
        if status != 200:
            return web.json_response({"error": {"message": "prompt too long"}}, status=status)
        return await sse(request, events, delay)

    return serve(handler, count_tokens)


def test_payload_pins_the_output_length_every_way_servers_understand():
    body = payload(SPEC)
    assert body["max_tokens"] == body["min_tokens"] == 3 and body["ignore_eos"] is True
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    native = payload(RequestSpec(**{**SPEC.__dict__, "backend": "llama.cpp"}))
    assert native["n_predict"] == 3


def test_chunks_become_ttft_itl_and_e2el():
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}}
    out = run([chunk("a"), chunk("b"), chunk("c"), usage, "[DONE]"], delay=0.02)
    assert out.success, out.error
    assert out.num_chunks == 3 and len(out.itl) == 2
    assert out.ttft >= 0.015
    assert out.latency == pytest.approx(out.ttft + sum(out.itl))
    assert out.generated_text == "abc"
    assert (out.prompt_len, out.output_tokens) == (3, 3)  # the server's usage wins


def test_without_usage_output_tokens_come_from_the_tokenizer():
    out = run([chunk("ab"), chunk("cd"), "[DONE]"], count_tokens=len)
    assert out.output_tokens == 4 and out.prompt_len == 2


def test_without_usage_or_tokenizer_each_chunk_is_one_token():
    assert run([chunk("ab"), chunk("cd")]).output_tokens == 2


def test_empty_text_chunks_still_count_as_token_chunks():
    out = run([chunk("a"), chunk(""), chunk("b")])
    assert out.num_chunks == 3 and len(out.itl) == 2


def test_http_error_is_a_failed_request_with_the_body():
    out = run([], status=400)
    assert not out.success and "HTTP 400" in out.error and "prompt too long" in out.error


def test_stream_without_choices_is_a_failure():
    out = run([{"choices": [], "usage": {"completion_tokens": 0}}, "[DONE]"])
    assert not out.success and "no streamed chunk" in out.error


def test_the_sent_body_is_the_payload():
    seen: list[dict] = []
    run([chunk("a")], seen=seen)
    assert seen == [payload(SPEC)]


def test_a_connection_closed_before_any_response_is_retried_once():
    calls = []

    async def handler(request: web.Request) -> web.StreamResponse:
        calls.append(1)
        if len(calls) == 1:  # close the socket with no response byte, as a keep-alive timeout does
            request.transport.close()
            await asyncio.sleep(0.05)
        return await sse(request, [chunk("a"), chunk("b")])

    out = serve(handler)
    assert out.success and len(calls) == 2 and out.generated_text == "ab"


def test_a_stream_cut_after_its_first_chunk_fails_and_is_not_retried():
    calls = []

    async def handler(request: web.Request) -> web.StreamResponse:
        calls.append(1)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"data: {json.dumps(chunk('a'))}\n\n".encode())
        request.transport.close()
        return response

    out = serve(handler)
    assert not out.success and out.num_chunks == 1 and len(calls) == 1
