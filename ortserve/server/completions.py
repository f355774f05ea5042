"""POST /v1/completions: prompts -> engine requests -> a CompletionResponse or its SSE stream."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from litestar import Request

from .engine_client import EngineClient
from .errors import error_event
from .logprobs import completion_logprobs
from .prompts import Prompts
from .protocol import CompletionRequest
from .responses import (
    CompletionChoice,
    CompletionResponse,
    Usage,
    finish_reason,
    now,
    random_id,
)
from .sampling import sampling_params
from .streams import EventStream, merge, until_disconnected

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions endpoint


@dataclass
class _Prompt:
    token_ids: list[int]
    text: str  # for echo


class CompletionsService:
    def __init__(self, client: EngineClient, model_name: str) -> None:
        self.client = client
        self.model_name = model_name

    async def create(self, body: CompletionRequest, request: Request
                     ) -> CompletionResponse | EventStream | None:
        prompts = self.client.check_ready()
        body.check(prompts.vocab_size)
        batch = [self._prompt(prompts, p, body) for p in body.prompts()]
        params = [sampling_params(body, logprobs=body.logprobs,
                                  max_tokens=prompts.max_tokens_for(len(p.token_ids), body.max_tokens,
                                                                    DEFAULT_MAX_TOKENS, "prompt"))
                  for p in batch]
        self.client.check_capacity(body.n * len(batch))
        request_id = random_id("cmpl")
        streams = [self.client.generate(f"{request_id}-{i}", p.token_ids, sp)
                   for i, (p, sp) in enumerate(zip(batch, params))]
        if body.stream:
            return EventStream(self._stream(request_id, body, batch, streams, prompts))
        return await until_disconnected(request, self._collect(request_id, body, batch, streams, prompts))

    @staticmethod
    def _prompt(prompts: Prompts, prompt: str | list[int], body: CompletionRequest) -> _Prompt:
        if isinstance(prompt, str):
            ids = prompts.encode(prompt)
            return _Prompt(ids, prompt)
        ids = prompts.check_ids(prompt, "prompt")
        return _Prompt(ids, prompts.decode(ids) if body.echo else "")

    async def _collect(self, request_id: str, body: CompletionRequest, batch: list[_Prompt],
                       streams: list[AsyncIterator], prompts: Prompts) -> CompletionResponse:
        finals: dict[int, Any] = {}
        cached = 0
        async with aclosing(merge(streams)) as merged:
            async for i, output in merged:
                for choice in output.outputs:
                    finals[i * body.n + choice.index] = choice
                if output.finished:
                    cached += getattr(output, "num_cached_tokens", 0) or 0
        choices = []
        for index in sorted(finals):
            out = finals[index]
            prefix = batch[index // body.n].text if body.echo else ""
            logprobs = (completion_logprobs(prompts, out.token_ids, out.logprobs, len(prefix))
                        if body.logprobs is not None and out.logprobs is not None else None)
            choices.append(CompletionChoice(index=index, text=prefix + out.text, logprobs=logprobs,
                                            finish_reason=finish_reason(out.finish_reason),
                                            stop_reason=out.stop_reason))
        usage = Usage.of(sum(len(p.token_ids) for p in batch),
                         sum(len(finals[i].token_ids) for i in finals), cached)
        return CompletionResponse(id=request_id, created=now(), model=self.model_name,
                                  choices=choices, usage=usage)

    async def _stream(self, request_id: str, body: CompletionRequest, batch: list[_Prompt],
                      streams: list[AsyncIterator], prompts: Prompts) -> AsyncIterator[str]:
        created = now()
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        continuous = bool(body.stream_options and body.stream_options.continuous_usage_stats)
        prompt_tokens = sum(len(p.token_ids) for p in batch)
        generated: dict[int, int] = {}
        cached = 0
        echoed: set[int] = set()
        try:
            async with aclosing(merge(streams)) as merged:
                async for i, output in merged:
                    if output.finished:
                        cached += getattr(output, "num_cached_tokens", 0) or 0
                    for out in output.outputs:
                        index = i * body.n + out.index
                        text = out.text_delta
                        if body.echo and index not in echoed:
                            echoed.add(index)
                            text = batch[i].text + text
                        if not text and out.finish_reason is None and body.logprobs is None:
                            continue  # text held back (a possible stop string) or nothing new
                        generated[index] = len(out.token_ids)
                        offset = len(out.text) - len(out.text_delta)
                        logprobs = None
                        if body.logprobs is not None and out.logprobs is not None:
                            fresh = out.logprobs[len(out.logprobs) - len(out.token_ids_delta):]
                            logprobs = completion_logprobs(prompts, out.token_ids_delta, fresh, offset)
                        chunk = CompletionResponse(
                            id=request_id, created=created, model=self.model_name,
                            choices=[CompletionChoice(index=index, text=text, logprobs=logprobs,
                                                      finish_reason=finish_reason(out.finish_reason),
                                                      stop_reason=out.stop_reason)],
                            usage=Usage.of(prompt_tokens, sum(generated.values())) if continuous else None)
                        yield chunk.model_dump_json()
        except Exception as exc:  # noqa: BLE001 - the status line is sent; report in-band
            yield error_event(exc)
            yield "[DONE]"
            return
        if include_usage:
            yield CompletionResponse(id=request_id, created=created, model=self.model_name, choices=[],
                                     usage=Usage.of(prompt_tokens, sum(generated.values()), cached)
                                     ).model_dump_json()
        yield "[DONE]"
