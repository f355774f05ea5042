"""POST /v1/chat/completions: messages -> chat template -> engine -> a ChatCompletionResponse or
its SSE stream of chunks. Templates render and prompts tokenize off the event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from litestar import Request

from .engine_client import EngineClient, RequestStream
from .errors import BadRequest, error_event
from .logprobs import chat_logprobs
from .protocol import ChatCompletionRequest
from .request_log import RequestLog
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
from .sampling import as_bad_request, sampling_params
from .settings import ServerSettings
from .streams import EventStream, SampleTotals, until_disconnected
from .template_sandbox import TemplateSandbox


class ChatService:
    def __init__(self, client: EngineClient, settings: ServerSettings, sandbox: TemplateSandbox) -> None:
        self.client = client
        self.settings = settings
        self.model_name = settings.served_model_name
        self.sandbox = sandbox

    async def create(
        self, body: ChatCompletionRequest, request: Request
    ) -> ChatCompletionResponse | EventStream | None:
        _, limits = self.client.check_ready()
        body.check()
        token_ids = await self.render(body)
        params = sampling_params(
            body,
            limits,
            token_ids,
            max_tokens=body.requested_max_tokens(),
            default_max_tokens=None,
            logprobs=body.logprobs_count(),
            prompt_param="messages",
        )
        log = RequestLog(random_id("chatcmpl"), "chat", prompt_tokens=len(token_ids))
        stream = self.client.submit(log.request_id, token_ids, params)
        if body.stream:
            return EventStream(self._stream(log, body, token_ids, stream))
        return await until_disconnected(request, self._collect(log, body, token_ids, stream), log)

    async def render(self, body: ChatCompletionRequest) -> list[int]:
        """The conversation's token ids; a template from the request only with
        --trust-request-chat-template, and then in the sandbox."""
        prompts, _ = self.client.check_ready()
        kwargs = dict(body.chat_template_kwargs or {})
        template = body.chat_template or kwargs.pop("chat_template", None)
        conversation = [m.conversation_entry() for m in body.messages]
        if template is not None:
            if not self.settings.trust_request_chat_template:
                raise BadRequest(
                    "'chat_template' in the request is refused: this server uses the model's "
                    "own (start it with --trust-request-chat-template to allow it)",
                    "chat_template",
                )
            with as_bad_request():
                prompts.check_content(conversation)
            text = await self.sandbox.render(
                str(template), conversation, body.add_generation_prompt, body.continue_final_message, kwargs
            )
            return await asyncio.to_thread(prompts.encode, text, False)
        with as_bad_request(type(body).model_fields):
            return await asyncio.to_thread(
                prompts.chat_token_ids, conversation, body.add_generation_prompt, body.continue_final_message, kwargs
            )

    async def _collect(
        self, log: RequestLog, body: ChatCompletionRequest, token_ids: list[int], stream: RequestStream
    ) -> ChatCompletionResponse:
        prompts, _ = self.client.check_ready()
        totals = SampleTotals(body.n)
        try:
            async with aclosing(stream):
                async for delta in stream:
                    totals.add(delta)
        except Exception:
            log.done("error")
            raise
        choices = []
        for index, out in enumerate(totals.samples):
            logprobs = (
                chat_logprobs(prompts, out.token_ids, out.logprobs)
                if body.logprobs and out.logprobs is not None
                else None
            )
            choices.append(
                ChatChoice(
                    index=index,
                    message=AssistantMessage(content=out.text),
                    logprobs=logprobs,
                    finish_reason=finish_reason(out.finish_reason),
                    stop_reason=out.stop_reason,
                )
            )
        log.completion_tokens = totals.num_generated
        log.done(200)
        return ChatCompletionResponse(
            id=log.request_id,
            created=now(),
            model=self.model_name,
            choices=choices,
            usage=Usage.of(len(token_ids), totals.num_generated, totals.num_cached_tokens),
        )

    async def _stream(
        self, log: RequestLog, body: ChatCompletionRequest, token_ids: list[int], stream: RequestStream
    ) -> AsyncIterator[str]:
        prompts, _ = self.client.check_ready()
        created = now()
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        continuous = bool(body.stream_options and body.stream_options.continuous_usage_stats)
        totals = SampleTotals(body.n)

        def chunk(choice: ChatChunkChoice) -> str:
            usage = Usage.of(len(token_ids), totals.num_generated) if continuous else None
            return ChatCompletionChunk(
                id=log.request_id, created=created, model=self.model_name, choices=[choice], usage=usage
            ).model_dump_json()

        status: Any = 200
        try:
            opened = False
            async with aclosing(stream):
                async for delta in stream:
                    if not opened:
                        # OpenAI opens each choice with the role alone; as vLLM does, once the first
                        # token exists, so no byte goes out for a request that has not started (the
                        # cluster's ingress sends such a request to another replica if this one dies)
                        opened = True
                        for index in range(body.n):
                            yield chunk(ChatChunkChoice(index=index, delta=DeltaMessage(role="assistant", content="")))
                    totals.add(delta)
                    for out in delta.samples:
                        if not out.text and out.finish_reason is None and not body.logprobs:
                            continue
                        logprobs = (
                            chat_logprobs(prompts, out.token_ids, out.logprobs)
                            if body.logprobs and out.logprobs is not None
                            else None
                        )
                        yield chunk(
                            ChatChunkChoice(
                                index=out.index,
                                delta=DeltaMessage(content=out.text or None),
                                logprobs=logprobs,
                                finish_reason=finish_reason(out.finish_reason),
                                stop_reason=out.stop_reason,
                            )
                        )
            if include_usage:
                yield ChatCompletionChunk(
                    id=log.request_id,
                    created=created,
                    model=self.model_name,
                    choices=[],
                    usage=Usage.of(len(token_ids), totals.num_generated, totals.num_cached_tokens),
                ).model_dump_json()
        except Exception as exc:  # noqa: BLE001 - the status line is sent; report in-band
            status = "error"
            yield error_event(exc, log.request_id)
        finally:
            log.completion_tokens = totals.num_generated
            log.done(status)
        yield "[DONE]"
