"""Client CPU a streamed chunk, httpx against aiohttp: what `ortserve bench serve` takes from the
server under test on a 2-core box.

A scripted SSE server in another process streams completion chunks with a gap between them, so that
each chunk reaches the client in a read of its own, as a server's tokens do. The client parses every
event as `ortserve bench serve` does and counts its own process CPU time (user + system), which the
host's other load hardly moves. Rounds alternate between the two clients.

    python benchmarks/bench_client_cpu.py [--chunks 400] [--requests 5] [--rounds 3] [--gap-ms 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import time

EVENT = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": "tok", "finish_reason": None}]}


def serve(port: int, chunks: int, gap: float) -> None:
    from aiohttp import web

    body = f"data: {json.dumps(EVENT)}\n\n".encode()

    async def completions(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for _ in range(chunks):
            await response.write(body)
            await asyncio.sleep(gap)
        await response.write(b"data: [DONE]\n\n")
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def parse(line: str) -> None:
    if line.startswith("data: {"):
        json.loads(line[6:])


async def httpx_cpu(url: str, requests: int) -> float:
    import httpx

    async with httpx.AsyncClient(timeout=60) as client:
        start = time.process_time()
        for _ in range(requests):
            async with client.stream("POST", url, json={}) as response:
                async for line in response.aiter_lines():
                    parse(line)
        return time.process_time() - start


async def aiohttp_cpu(url: str, requests: int) -> float:
    import aiohttp

    async with aiohttp.ClientSession() as client:
        start = time.process_time()
        for _ in range(requests):
            async with client.post(url, json={}) as response:
                async for line in response.content:
                    parse(line.decode())
        return time.process_time() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chunks", type=int, default=400, help="chunks a request")
    p.add_argument("--requests", type=int, default=5, help="requests a round, one at a time")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gap-ms", type=float, default=2.0, help="server's pause between chunks")
    args = p.parse_args()
    port = free_port()
    server = multiprocessing.Process(target=serve, args=(port, args.chunks, args.gap_ms / 1e3), daemon=True)
    server.start()
    time.sleep(1.5)
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        for r in range(args.rounds):
            for name, client in (("httpx", httpx_cpu), ("aiohttp", aiohttp_cpu)):
                cpu = asyncio.run(client(url, args.requests))
                print(f"round {r} {name:8s} {cpu / (args.requests * args.chunks) * 1e3:.3f} ms client CPU a chunk")
    finally:
        server.terminate()


if __name__ == "__main__":
    main()
