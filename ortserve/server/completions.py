"""POST /v1/completions: prompts -> engine requests -> a CompletionResponse or its SSE stream.
Prompts tokenize off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from litestar import Request

from ortserve.tokenizer import ChatPrompts

from .engine_client import EngineClient, RequestStream
from .errors import error_event
from .logprobs import completion_logprobs
from .protocol import CompletionRequest
from .request_log import RequestLog
from .responses import CompletionChoice, CompletionResponse, Usage, finish_reason, now, random_id
from .sampling import as_bad_request, sampling_params
from .streams import EventStream, SampleTotals, merge, until_disconnected

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint


@dataclass
class _Prompt:
    token_ids: list[int]
    text: str  # for echo


class CompletionsService:
    def __init__(self, client: EngineClient, model_name: str) -> None:
        self.client = client
        self.model_name = model_name

    async def create(self, body: CompletionRequest, request: Request) -> CompletionResponse | EventStream | None:
        prompts, limits = self.client.check_ready()
        body.check()
        batch = await asyncio.to_thread(self._tokenize, prompts, body)
        params = [
            sampling_params(
                body,
                limits,
                p.token_ids,
                max_tokens=body.max_tokens,
                default_max_tokens=DEFAULT_MAX_TOKENS,
                logprobs=body.logprobs,
                prompt_param="prompt",
            )
            for p in batch
        ]
        log = RequestLog(random_id("cmpl"), "completions", prompt_tokens=sum(len(p.token_ids) for p in batch))
        streams: list[RequestStream] = []
        try:
            for i, (p, sp) in enumerate(zip(batch, params)):
                streams.append(self.client.submit(f"{log.request_id}-{i}", p.token_ids, sp))
        except Exception:
            for admitted in streams:
                await admitted.aclose()
            raise
        if body.stream:
            return EventStream(self._stream(log, body, batch, streams))
        return await until_disconnected(request, self._collect(log, body, batch, streams), log)

    @staticmethod
    def _tokenize(prompts: ChatPrompts, body: CompletionRequest) -> list[_Prompt]:
        batch = []
        with as_bad_request():
            for prompt in body.prompts():
                if isinstance(prompt, str):
                    batch.append(_Prompt(prompts.encode(prompt), prompt))
                else:
                    batch.append(_Prompt(list(prompt), prompts.decode(prompt) if body.echo else ""))
        return batch

    async def _collect(
        self, log: RequestLog, body: CompletionRequest, batch: list[_Prompt], streams: list[RequestStream]
    ) -> CompletionResponse:
        prompts, _ = self.client.check_ready()
        totals = [SampleTotals(body.n) for _ in batch]
        try:
            async with aclosing(merge(streams)) as merged:
                async for i, delta in merged:
                    totals[i].add(delta)
        except Exception:
            log.done("error")
            raise
        choices = []
        for i, prompt_totals in enumerate(totals):
            for j, out in enumerate(prompt_totals.samples):
                prefix = batch[i].text if body.echo else ""
                logprobs = (
                    completion_logprobs(prompts, out.token_ids, out.logprobs, len(prefix))
                    if body.logprobs is not None and out.logprobs is not None
                    else None
                )
                choices.append(
                    CompletionChoice(
                        index=i * body.n + j,
                        text=prefix + out.text,
                        logprobs=logprobs,
                        finish_reason=finish_reason(out.finish_reason),
                        stop_reason=out.stop_reason,
                    )
                )
        generated = sum(t.num_generated for t in totals)
        log.completion_tokens = generated
        log.done(200)
        return CompletionResponse(
            id=log.request_id,
            created=now(),
            model=self.model_name,
            choices=choices,
            usage=Usage.of(log.prompt_tokens, generated, sum(t.num_cached_tokens for t in totals)),
        )

    async def _stream(
        self, log: RequestLog, body: CompletionRequest, batch: list[_Prompt], streams: list[RequestStream]
    ) -> AsyncIterator[str]:
        prompts, _ = self.client.check_ready()
        created = now()
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        continuous = bool(body.stream_options and body.stream_options.continuous_usage_stats)
        totals = [SampleTotals(body.n) for _ in batch]
        echoed: set[int] = set()
        status: Any = 200

        def generated() -> int:
            return sum(t.num_generated for t in totals)

        try:
            async with aclosing(merge(streams)) as merged:
                async for i, delta in merged:
                    totals[i].add(delta)
                    for out in delta.samples:
                        index = i * body.n + out.index
                        text = out.text
                        if body.echo and index not in echoed:
                            echoed.add(index)
                            text = batch[i].text + text
                        if not text and out.finish_reason is None and body.logprobs is None:
                            continue  # text held back (a possible stop string) or nothing new
                        sample = totals[i].samples[out.index]
                        logprobs = None
                        if body.logprobs is not None and out.logprobs is not None:
                            offset = len(sample.text) - len(out.text)
                            logprobs = completion_logprobs(prompts, out.token_ids, out.logprobs, offset)
                        chunk = CompletionResponse(
                            id=log.request_id,
                            created=created,
                            model=self.model_name,
                            choices=[
                                CompletionChoice(
                                    index=index,
                                    text=text,
                                    logprobs=logprobs,
                                    finish_reason=finish_reason(out.finish_reason),
                                    stop_reason=out.stop_reason,
                                )
                            ],
                            usage=Usage.of(log.prompt_tokens, generated()) if continuous else None,
                        )
                        yield chunk.model_dump_json()
            if include_usage:
                yield CompletionResponse(
                    id=log.request_id,
                    created=created,
                    model=self.model_name,
                    choices=[],
                    usage=Usage.of(log.prompt_tokens, generated(), sum(t.num_cached_tokens for t in totals)),
                ).model_dump_json()
        except Exception as exc:  # noqa: BLE001 - the status line is sent; report in-band
            status = "error"
            yield error_event(exc, log.request_id)
        finally:
            log.completion_tokens = generated()
            log.done(status)
        yield "[DONE]"
