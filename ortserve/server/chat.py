"""POST /v1/chat/completions: messages -> chat template -> engine -> a ChatCompletionResponse or
its SSE stream of chunks. Templates render, prompts tokenize and grammars compile off the event
loop.

``prepare`` is shared with the Responses API (responses_api.py): it renders the conversation
(with the request's tools, tools.py), settles structured outputs (structured.py) and the
SamplingParams. Each choice's text then goes through its ``ToolCallExtractor`` (when tools may be
called), streamed or not, so a streamed call reassembles into exactly the non-streamed one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from litestar import Request

from ortserve.sampling_params import SamplingParams
from ortserve.tokenizer import inject_tools, renders_tools

from .engine_client import EngineClient, RequestStream
from .errors import BadRequest, error_event
from .logprobs import chat_logprobs, prompt_logprobs
from .protocol import ChatCompletionRequest
from .request_log import RequestLog
from .responses import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    DeltaMessage,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
    finish_reason,
    now,
    random_id,
)
from .sampling import as_bad_request, sampling_params
from .settings import ServerSettings
from .streams import EventStream, SampleTotals, until_disconnected
from .structured import checked, one_of, requested
from .template_sandbox import TemplateSandbox
from .tool_parsers import Content, ToolCallExtractor
from .tools import ToolPlan, plan_tools


@dataclass
class Prepared:
    """A chat request made ready for the engine."""

    token_ids: list[int]
    params: SamplingParams
    plan: ToolPlan | None
    echo: str  # text that starts every choice (echo of the last assistant message)

    def extractor(self) -> ToolCallExtractor | None:
        return self.plan.extractor() if self.plan is not None else None

    def called(self) -> Any:
        return "function_call" if self.plan is not None and self.plan.legacy else "tool_calls"


class ChatService:
    def __init__(self, client: EngineClient, settings: ServerSettings, sandbox: TemplateSandbox) -> None:
        self.client = client
        self.settings = settings
        self.model_name = settings.served_model_name
        self.sandbox = sandbox

    async def create(
        self, body: ChatCompletionRequest, request: Request
    ) -> ChatCompletionResponse | EventStream | None:
        prepared = await self.prepare(body)
        end_user = body.user or body.safety_identifier
        log = RequestLog(random_id("chatcmpl"), "chat", prompt_tokens=len(prepared.token_ids), user=end_user)
        stream = self.client.submit(log.request_id, prepared.token_ids, prepared.params)
        if body.stream:
            return EventStream(self._stream(log, body, prepared, stream))
        return await until_disconnected(request, self._collect(log, body, prepared, stream), log)

    async def prepare(self, body: ChatCompletionRequest) -> Prepared:
        prompts, limits = self.client.check_ready()
        body.check()
        template = body.chat_template or (body.chat_template_kwargs or {}).get("chat_template")
        plan = plan_tools(body, str(template or prompts.tokenizer.chat_template), self.settings.tool_call_parser)
        token_ids = await self.render(body, plan)
        structured = one_of(requested(body))
        forced = plan.forcing(prompts.special_token_id(plan.fmt.start)) if plan is not None else None
        if forced is not None and structured is not None:
            raise BadRequest(f"'tool_choice' forces a call, so '{structured[0]}' cannot apply too", structured[0])
        spec = None
        if structured is not None:
            spec = await checked(*structured)
        elif plan is not None and forced is not None:
            spec = await checked("function_call" if plan.legacy else "tool_choice", forced)
        if body.truncate_prompt_tokens is not None:
            token_ids = token_ids[-body.truncate_prompt_tokens :]
        keep_special = plan is not None and plan.parses and prompts.special_token_id(plan.fmt.start) is not None
        params = sampling_params(
            body,
            limits,
            token_ids,
            max_tokens=body.requested_max_tokens(),
            default_max_tokens=None,
            logprobs=body.logprobs_count(),
            prompt_param="messages",
            model_defaults=self.client.sampling_defaults,
            structured_outputs=spec,
            prompt_logprobs=body.prompt_logprobs,
            skip_special_tokens=body.skip_special_tokens and not keep_special,
        )
        last = body.messages[-1]
        echo = last.text() if body.echo and last.role == "assistant" else ""
        return Prepared(token_ids, params, plan, echo)

    async def render(self, body: ChatCompletionRequest, plan: ToolPlan | None = None) -> list[int]:
        """The conversation's token ids; a template from the request only with
        --trust-request-chat-template, and then in the sandbox."""
        prompts, _ = self.client.check_ready()
        kwargs = dict(body.chat_template_kwargs or {})
        template = body.chat_template or kwargs.pop("chat_template", None)
        conversation = [m.conversation_entry() for m in body.messages]
        tools = plan.template_tools() if plan is not None else None
        if template is not None:
            if not self.settings.trust_request_chat_template:
                raise BadRequest(
                    "'chat_template' in the request is refused: this server uses the model's "
                    "own (start it with --trust-request-chat-template to allow it)",
                    "chat_template",
                )
            if renders_tools(str(template)):
                kwargs["tools"] = tools
            else:
                conversation = inject_tools(conversation, tools)
            with as_bad_request():
                prompts.check_content(conversation)
            text = await self.sandbox.render(
                str(template), conversation, body.add_generation_prompt, body.continue_final_message, kwargs
            )
            return await asyncio.to_thread(prompts.encode, text, False)
        with as_bad_request(type(body).model_fields):
            return await asyncio.to_thread(
                prompts.chat_token_ids,
                conversation,
                body.add_generation_prompt,
                body.continue_final_message,
                kwargs,
                tools,
            )

    async def _collect(
        self, log: RequestLog, body: ChatCompletionRequest, prepared: Prepared, stream: RequestStream
    ) -> ChatCompletionResponse:
        prompts, _ = self.client.check_ready()
        totals = await SampleTotals.of(body.n, stream, log)
        choices = []
        for index, out in enumerate(totals.samples):
            logprobs = (
                chat_logprobs(prompts, out.token_ids, out.logprobs)
                if body.logprobs and out.logprobs is not None
                else None
            )
            message, called = assistant_message(prepared, prepared.echo + out.text)
            choices.append(
                ChatChoice(
                    index=index,
                    message=message,
                    logprobs=logprobs,
                    finish_reason=finish_reason(out.finish_reason, called),
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
            usage=Usage.of(len(prepared.token_ids), totals.num_generated, totals.num_cached_tokens),
            prompt_logprobs=prompt_logprobs(prompts, prepared.token_ids, totals.prompt_logprobs)
            if totals.prompt_logprobs is not None
            else None,
        )

    async def _stream(
        self, log: RequestLog, body: ChatCompletionRequest, prepared: Prepared, stream: RequestStream
    ) -> AsyncIterator[str]:
        prompts, _ = self.client.check_ready()
        created = now()
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        continuous = bool(body.stream_options and body.stream_options.continuous_usage_stats)
        totals = SampleTotals(body.n)
        token_ids = prepared.token_ids
        choices = [ChoiceStream(prepared) for _ in range(body.n)]

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
                            if prepared.echo:
                                yield chunk(ChatChunkChoice(index=index, delta=DeltaMessage(content=prepared.echo)))
                    totals.add(delta)
                    for out in delta.samples:
                        logprobs = (
                            chat_logprobs(prompts, out.token_ids, out.logprobs)
                            if body.logprobs and out.logprobs is not None
                            else None
                        )
                        deltas = choices[out.index].feed(out.text, out.finish_reason is not None)
                        if not deltas and (out.finish_reason is not None or logprobs is not None):
                            deltas = [DeltaMessage()]
                        for i, message in enumerate(deltas):
                            last = i == len(deltas) - 1
                            yield chunk(
                                ChatChunkChoice(
                                    index=out.index,
                                    delta=message,
                                    logprobs=logprobs if i == 0 else None,
                                    finish_reason=finish_reason(out.finish_reason, choices[out.index].called())
                                    if last
                                    else None,
                                    stop_reason=out.stop_reason if last else None,
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


def assistant_message(prepared: Prepared, text: str) -> tuple[AssistantMessage, Any]:
    """A choice's whole text as the assistant's message, and "tool_calls" if it called any: the
    streamed deltas of the same text, added up (so both answers always agree)."""
    choice = ChoiceStream(prepared)
    deltas = choice.feed(text, finished=True)
    content = "".join(d.content for d in deltas if d.content)
    if not choice.num_calls:
        return AssistantMessage(content=content), None
    if choice.legacy:
        call = next(d.function_call for d in deltas if d.function_call is not None)
        function = FunctionCall(name=call.name or "", arguments=call.arguments or "")
        return AssistantMessage(content=content or None, function_call=function), "function_call"
    calls: list[ToolCall] = []
    for d in deltas:
        for c in d.tool_calls or []:
            if c.id is not None:
                calls.append(ToolCall(id=c.id, function=FunctionCall(name=c.function.name or "", arguments="")))
            else:
                calls[c.index].function.arguments += c.function.arguments or ""
    return AssistantMessage(content=content or None, tool_calls=calls), "tool_calls"


class ChoiceStream:
    """One streamed choice: text deltas -> DeltaMessages (content, or OpenAI's call deltas)."""

    def __init__(self, prepared: Prepared) -> None:
        self.prepared = prepared
        self.extractor = prepared.extractor()
        self.legacy = prepared.plan is not None and prepared.plan.legacy
        self.num_calls = 0
        self.blank = ""  # whitespace held back: sent before more text, dropped if calls came last

    def called(self) -> Any:
        return self.prepared.called() if self.num_calls else None

    def feed(self, text: str, finished: bool) -> list[DeltaMessage]:
        if self.extractor is None:
            return [DeltaMessage(content=text)] if text else []
        events = self.extractor.feed(text) if text else []
        if finished:
            events += self.extractor.finish()
        out = []
        for event in events:
            if isinstance(event, Content):
                if not event.text.strip():
                    self.blank += event.text
                    continue
                out.append(DeltaMessage(content=self.blank + event.text))
                self.blank = ""
            elif self.legacy:
                if not self.num_calls:  # the legacy answer has one call
                    out.append(
                        DeltaMessage(function_call=FunctionCallDelta(name=event.name, arguments=event.arguments))
                    )
                self.num_calls += 1
            else:
                header = ToolCallDelta(
                    index=self.num_calls,
                    id=event.id,
                    type="function",
                    function=FunctionCallDelta(name=event.name, arguments=""),
                )
                arguments = ToolCallDelta(index=self.num_calls, function=FunctionCallDelta(arguments=event.arguments))
                out += [DeltaMessage(tool_calls=[header]), DeltaMessage(tool_calls=[arguments])]
                self.num_calls += 1
        if finished and self.blank and not self.num_calls:
            out.append(DeltaMessage(content=self.blank))
        return out
