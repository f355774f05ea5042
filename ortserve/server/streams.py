"""Async helpers for the HTTP handlers: merge several generation streams, and stop work when
the HTTP client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import aclosing
from typing import Any, TypeVar

from litestar import Request
from litestar.response import ServerSentEvent

from ortserve.engine.ipc import FinishReason, RequestDelta, TokenLogprob

from .request_log import RequestLog

T = TypeVar("T")
_DONE = object()


async def merge(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of all streams as (stream index, item), in arrival order. Closing the merged
    stream closes every source (which aborts their requests)."""
    if len(streams) == 1:
        async with aclosing(streams[0]) as only:  # type: ignore[type-var]
            async for item in only:
                yield 0, item
        return
    arrivals: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async with aclosing(stream):  # type: ignore[type-var]
                async for item in stream:
                    arrivals.put_nowait((index, item))
        except Exception as exc:  # noqa: BLE001 - handed to the consumer
            arrivals.put_nowait((index, exc))
        finally:
            arrivals.put_nowait((index, _DONE))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            index, item = await arrivals.get()
            if item is _DONE:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item  # type: ignore[misc]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class SampleText:
    """One sample's deltas added up."""

    def __init__(self) -> None:
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] | None = None
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None


class SampleTotals:
    """The deltas of a request's ``n`` samples added up, for a response that is not streamed
    (and the token counts for usage)."""

    def __init__(self, n: int) -> None:
        self.samples = [SampleText() for _ in range(n)]
        self.num_generated = 0
        self.num_cached_tokens = 0
        self.prompt_logprobs: list[TokenLogprob] | None = None  # prompt tokens 1.. when asked

    def add(self, delta: RequestDelta) -> None:
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        for d in delta.samples:
            out = self.samples[d.index]
            out.text += d.text
            out.token_ids += d.token_ids
            self.num_generated += len(d.token_ids)
            if d.logprobs is not None:
                out.logprobs = (out.logprobs or []) + d.logprobs
            if d.finish_reason is not None:
                out.finish_reason, out.stop_reason = d.finish_reason, d.stop_reason
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)

    @classmethod
    async def of(cls, n: int, stream: AsyncIterator[RequestDelta], log: RequestLog) -> SampleTotals:
        """A request's whole stream added up; if it fails, the request's log line says so."""
        totals = cls(n)
        try:
            async with aclosing(stream):
                async for delta in stream:
                    totals.add(delta)
        except Exception:
            log.done("error")
            raise
        return totals


async def until_disconnected(request: Request, work: Awaitable[T], log: RequestLog | None = None) -> T | None:
    """Run ``work``; if the HTTP client disconnects first, cancel it (aborting its engine
    requests) and return None."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.create_task(_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            if log is not None:
                log.done("client-disconnected")
    return task.result() if not task.cancelled() else None


async def _disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class EventStream(ServerSentEvent):
    """Litestar's SSE response, keeping ``text/event-stream`` even though the route's own media
    type is JSON (Stream.to_asgi_response prefers the route's)."""

    def to_asgi_response(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["media_type"] = self.media_type
        return super().to_asgi_response(*args, **kwargs)
