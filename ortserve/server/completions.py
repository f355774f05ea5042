"""POST /v1/completions: prompts -> engine requests -> a CompletionResponse or its SSE stream.
Prompts tokenize and grammars compile off the event loop.

``echo`` with ``logprobs`` (and vLLM's ``prompt_logprobs``) returns the prompt's logprobs, computed
in the same prefill. ``best_of`` generates that many samples and returns the ``n`` with the
highest cumulative logprob (vLLM's rule; not streamed).
"""

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
from .logprobs import completion_logprobs, echo_logprobs, prompt_logprobs
from .protocol import CompletionRequest
from .request_log import RequestLog
from .responses import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    PromptLogprobs,
    Usage,
    finish_reason,
    now,
    random_id,
)
from .sampling import as_bad_request, sampling_params
from .streams import EventStream, SampleText, SampleTotals, merge, until_disconnected
from .structured import checked, one_of, requested

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
        structured = one_of(requested(body))
        spec = await checked(*structured) if structured is not None else None
        batch = await asyncio.to_thread(self._tokenize, prompts, body)
        best_of = body.best_of or body.n
        params = [
            sampling_params(
                body,
                limits,
                p.token_ids,
                max_tokens=body.max_tokens,
                default_max_tokens=DEFAULT_MAX_TOKENS,
                logprobs=body.logprobs if best_of == body.n else (body.logprobs or 0),
                prompt_param="prompt",
                model_defaults=self.client.sampling_defaults,
                n=best_of,
                structured_outputs=spec,
                prompt_logprobs=body.echo_logprobs(),
            )
            for p in batch
        ]
        log = RequestLog(
            random_id("cmpl"), "completions", prompt_tokens=sum(len(p.token_ids) for p in batch), user=body.user
        )
        if len(batch) > 1:
            self.client.check_fits(len(batch) * best_of, f"{len(batch)} prompts x n {best_of}")
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
        """Token ids (cut to truncate_prompt_tokens) and, for echo, the text they stand for."""
        batch = []
        keep = body.truncate_prompt_tokens
        with as_bad_request():
            for prompt in body.prompts():
                ids = prompts.encode(prompt) if isinstance(prompt, str) else list(prompt)
                cut = keep is not None and keep < len(ids)
                ids = ids[-keep:] if cut and keep is not None else ids
                text = prompt if isinstance(prompt, str) and not cut else prompts.decode(ids) if body.echo else ""
                batch.append(_Prompt(ids, text))
        return batch

    def _prompt_logprobs(self, body: CompletionRequest, prompt: _Prompt, totals: SampleTotals) -> PromptLogprobs | None:
        """vLLM's prompt_logprobs field, when it was asked (not for echo's own logprobs)."""
        if body.prompt_logprobs is None or totals.prompt_logprobs is None:
            return None
        prompts, _ = self.client.check_ready()
        return prompt_logprobs(prompts, prompt.token_ids, totals.prompt_logprobs)

    async def _collect(
        self, log: RequestLog, body: CompletionRequest, batch: list[_Prompt], streams: list[RequestStream]
    ) -> CompletionResponse:
        prompts, _ = self.client.check_ready()
        totals = [SampleTotals(body.best_of or body.n) for _ in batch]
        try:
            async with aclosing(merge(streams)) as merged:
                async for i, delta in merged:
                    totals[i].add(delta)
        except Exception:
            log.done("error")
            raise
        choices = []
        for i, prompt_totals in enumerate(totals):
            prompt = batch[i]
            for j, out in enumerate(best(prompt_totals.samples, body.n)):
                prefix = prompt.text if body.echo else ""
                logprobs = None
                if body.logprobs is not None and out.logprobs is not None:
                    logprobs = completion_logprobs(prompts, out.token_ids, out.logprobs, len(prefix))
                    if body.echo and prompt_totals.prompt_logprobs is not None:
                        logprobs = joined(
                            echo_logprobs(prompts, prompt.token_ids, prompt_totals.prompt_logprobs), logprobs
                        )
                choices.append(
                    CompletionChoice(
                        index=i * body.n + j,
                        text=prefix + out.text,
                        logprobs=logprobs,
                        finish_reason=finish_reason(out.finish_reason),
                        stop_reason=out.stop_reason,
                        prompt_logprobs=self._prompt_logprobs(body, prompt, prompt_totals),
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
        totals = [SampleTotals(body.best_of or body.n) for _ in batch]
        echoed: set[int] = set()
        status: Any = 200

        def generated() -> int:
            return sum(t.num_generated for t in totals)

        try:
            async with aclosing(merge(streams)) as merged:
                async for i, delta in merged:
                    totals[i].add(delta)
                    first_delta = delta.prompt_logprobs is not None
                    for out in delta.samples:
                        index = i * body.n + out.index
                        text = out.text
                        first = body.echo and index not in echoed
                        if first:
                            echoed.add(index)
                            text = batch[i].text + text
                        if not text and out.finish_reason is None and body.logprobs is None and not first_delta:
                            continue  # text held back (a possible stop string) or nothing new
                        sample = totals[i].samples[out.index]
                        logprobs = None
                        if body.logprobs is not None and out.logprobs is not None:
                            offset = len(sample.text) - len(out.text) + (len(batch[i].text) if body.echo else 0)
                            logprobs = completion_logprobs(prompts, out.token_ids, out.logprobs, offset)
                            if first and totals[i].prompt_logprobs is not None:
                                echoed_lp = echo_logprobs(prompts, batch[i].token_ids, totals[i].prompt_logprobs)
                                logprobs = joined(echoed_lp, logprobs)
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
                                    prompt_logprobs=self._prompt_logprobs(body, batch[i], totals[i])
                                    if delta.prompt_logprobs is not None
                                    else None,
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


def best(samples: list[SampleText], n: int) -> list[SampleText]:
    """best_of: the ``n`` samples with the highest cumulative logprob, best first (vLLM's rule)."""
    if len(samples) == n:
        return samples
    return sorted(samples, key=lambda s: -sum(lp.logprob for lp in s.logprobs or ()))[:n]


def joined(first: CompletionLogprobs, then: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(
        text_offset=first.text_offset + then.text_offset,
        token_logprobs=first.token_logprobs + then.token_logprobs,
        tokens=first.tokens + then.tokens,
        top_logprobs=first.top_logprobs + then.top_logprobs,
    )
