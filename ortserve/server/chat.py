"""POST /v1/chat/completions: messages -> chat template -> engine -> a ChatCompletionResponse or
its SSE stream of chunks."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from litestar import Request

from .engine_client import EngineClient
from .errors import error_event
from .logprobs import chat_logprobs
from .prompts import Prompts
from .protocol import ChatCompletionRequest
from .responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    DeltaMessage,
    Usage,
    finish_reason,
    now,
    random_id,
)
from .sampling import sampling_params
from .streams import EventStream, until_disconnected


class ChatService:
    def __init__(self, client: EngineClient, model_name: str) -> None:
        self.client = client
        self.model_name = model_name

    async def create(self, body: ChatCompletionRequest, request: Request
                     ) -> ChatCompletionResponse | EventStream | None:
        prompts = self.client.check_ready()
        body.check(prompts.vocab_size)
        token_ids = prompts.render_chat(body.messages, body.add_generation_prompt,
                                        body.continue_final_message, body.chat_template_kwargs)
        max_tokens = prompts.max_tokens_for(len(token_ids), body.requested_max_tokens(), None,
                                            "messages")
        params = sampling_params(body, max_tokens=max_tokens, logprobs=body.logprobs_count())
        self.client.check_capacity(body.n)
        request_id = random_id("chatcmpl")
        stream = self.client.generate(request_id, token_ids, params)
        if body.stream:
            return EventStream(self._stream(request_id, body, token_ids, stream, prompts))
        return await until_disconnected(request, self._collect(request_id, body, token_ids, stream,
                                                               prompts))

    async def _collect(self, request_id: str, body: ChatCompletionRequest, token_ids: list[int],
                       stream: AsyncIterator, prompts: Prompts) -> ChatCompletionResponse:
        finals: dict[int, Any] = {}
        cached = 0
        async with aclosing(stream):  # type: ignore[type-var]
            async for output in stream:
                for choice in output.outputs:
                    finals[choice.index] = choice
                if output.finished:
                    cached = getattr(output, "num_cached_tokens", 0) or 0
        choices = []
        for index in sorted(finals):
            out = finals[index]
            logprobs = (chat_logprobs(prompts, out.token_ids, out.logprobs)
                        if body.logprobs and out.logprobs is not None else None)
            choices.append(ChatChoice(index=index, message=AssistantMessage(content=out.text),
                                      logprobs=logprobs, finish_reason=finish_reason(out.finish_reason),
                                      stop_reason=out.stop_reason))
        usage = Usage.of(len(token_ids), sum(len(c.token_ids) for c in finals.values()), cached)
        return ChatCompletionResponse(id=request_id, created=now(), model=self.model_name,
                                      choices=choices, usage=usage)

    async def _stream(self, request_id: str, body: ChatCompletionRequest, token_ids: list[int],
                      stream: AsyncIterator, prompts: Prompts) -> AsyncIterator[str]:
        created = now()
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        continuous = bool(body.stream_options and body.stream_options.continuous_usage_stats)
        generated: dict[int, int] = {}
        cached = 0

        def chunk(choice: ChatChunkChoice) -> str:
            usage = Usage.of(len(token_ids), sum(generated.values())) if continuous else None
            return ChatCompletionChunk(id=request_id, created=created, model=self.model_name,
                                       choices=[choice], usage=usage).model_dump_json()

        for index in range(body.n):  # OpenAI opens each choice with the role alone
            yield chunk(ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content="")))
        try:
            async with aclosing(stream):  # type: ignore[type-var]
                async for output in stream:
                    if output.finished:
                        cached = getattr(output, "num_cached_tokens", 0) or 0
                    for out in output.outputs:
                        if not out.text_delta and out.finish_reason is None and not body.logprobs:
                            continue
                        generated[out.index] = len(out.token_ids)
                        logprobs = None
                        if body.logprobs and out.logprobs is not None:
                            fresh = out.logprobs[len(out.logprobs) - len(out.token_ids_delta):]
                            logprobs = chat_logprobs(prompts, out.token_ids_delta, fresh)
                        yield chunk(ChatChunkChoice(
                            index=out.index, delta=DeltaMessage(content=out.text_delta or None),
                            logprobs=logprobs, finish_reason=finish_reason(out.finish_reason),
                            stop_reason=out.stop_reason))
        except Exception as exc:  # noqa: BLE001 - the status line is sent; report in-band
            yield error_event(exc)
            yield "[DONE]"
            return
        if include_usage:
            yield ChatCompletionChunk(id=request_id, created=created, model=self.model_name,
                                      choices=[], usage=Usage.of(len(token_ids),
                                                                 sum(generated.values()), cached)
                                      ).model_dump_json()
        yield "[DONE]"
