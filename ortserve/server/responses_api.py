"""POST /v1/responses: OpenAI's Responses API, stateless, on top of the chat service.

A request becomes a chat request (``instructions`` a system message, ``input`` items messages,
``function_call`` items assistant tool calls, ``function_call_output`` items tool messages,
``text.format`` the response format, ``tools`` flat function tools), runs through
``ChatService.prepare`` (template, tools, structured outputs, sampling), and the answer becomes
``output`` items: a ``message`` with ``output_text``, and one ``function_call`` per call.
Streaming sends the typed events (``response.created``, ``response.in_progress``,
``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta``,
``...done``, ``response.function_call_arguments.delta``/``done``, ``response.completed``).

Nothing is stored: ``previous_response_id`` and ``store: true`` are a 400 naming them. The output
items and their events are response_items.py's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated, Any, Literal

from litestar import Request
from litestar.response import ServerSentEventMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError, WithJsonSchema, model_validator

from ortserve.tokenizer import ChatPrompts

from .chat import ChatService, ChoiceStream, Prepared, assistant_message
from .engine_client import RequestStream
from .errors import BadRequest, error_event
from .logprobs import chat_logprobs
from .protocol import (
    MAX_MESSAGES,
    CallerFields,
    ChatCompletionRequest,
    ContentText,
    EndUserId,
    LogprobCount,
    RequestModel,
    TokenCount,
    bounded,
    check_text_part,
)
from .request_log import RequestLog
from .response_items import ResponseEvents, ResponseObject, call_item, message_item
from .responses import random_id
from .schema_rules import FORCED_TOOL, needs_nonempty
from .streams import EventStream, SampleTotals, until_disconnected
from .structured import JsonObjectFormat, JsonSchemaObject, TextFormat
from .tools import FunctionName

STRICT = ConfigDict(extra="ignore", strict=True)
FORBID = ConfigDict(extra="forbid", strict=True)
NOT_SUPPORTED = WithJsonSchema({"type": "null", "description": "Not supported (nothing is stored): omit it"})


class InputText(BaseModel):
    model_config = STRICT
    type: Literal["input_text", "output_text"]
    text: ContentText

    @model_validator(mode="before")
    @classmethod
    def text_only(cls, part: Any) -> Any:
        return check_text_part(part, ("input_text", "output_text"))


class MessageItem(BaseModel):
    model_config = STRICT
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: ContentText | Annotated[list[InputText], Field(max_length=MAX_MESSAGES)]


class FunctionCallItem(BaseModel):
    model_config = STRICT
    type: Literal["function_call"]
    call_id: Annotated[str, Field(max_length=256)]
    name: FunctionName
    arguments: ContentText


class FunctionCallOutputItem(BaseModel):
    model_config = STRICT
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(max_length=256)]
    output: ContentText


class FunctionToolParam(BaseModel):
    model_config = FORBID
    type: Literal["function"]
    name: FunctionName
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: JsonSchemaObject | None = None
    strict: bool | None = None


class NamedFunction(BaseModel):
    model_config = FORBID
    type: Literal["function"]
    name: FunctionName


class JsonSchemaText(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    type: Literal["json_schema"]
    name: Annotated[str, Field(max_length=64)] = "response"
    description: str | None = None
    schema_: JsonSchemaObject = Field(alias="schema")
    strict: bool | None = None


class TextConfig(BaseModel):
    model_config = FORBID
    format: Annotated[TextFormat | JsonObjectFormat | JsonSchemaText, Field(discriminator="type")] | None = None


JSON_TEXT = {
    "type": "object",
    "properties": {"format": {"type": "object", "properties": {"type": {"enum": ["json_object", "json_schema"]}}}},
    "required": ["format"],
}


LOGPROBS = "message.output_text.logprobs"  # the one 'include' value: output_text's token logprobs
TOP_LOGPROBS_NEED_INCLUDE = {
    "if": {"properties": {"top_logprobs": {"type": "integer", "minimum": 1}}, "required": ["top_logprobs"]},
    "then": {"properties": {"include": {"type": "array", "contains": {"const": LOGPROBS}}}, "required": ["include"]},
}


class ResponsesRequest(RequestModel, CallerFields):
    """POST /v1/responses."""

    model_config = ConfigDict(
        extra="allow",
        strict=True,
        json_schema_extra={
            "allOf": [
                needs_nonempty("tool_choice", FORCED_TOOL, "tools"),
                {
                    "not": {
                        "properties": {"tool_choice": FORCED_TOOL, "text": JSON_TEXT},
                        "required": ["tool_choice", "text"],
                    }
                },
                TOP_LOGPROBS_NEED_INCLUDE,
            ]
        },
    )

    model: str | None = None
    input: (
        ContentText
        | Annotated[
            list[MessageItem | FunctionCallItem | FunctionCallOutputItem], Field(min_length=1, max_length=MAX_MESSAGES)
        ]
    )
    instructions: ContentText | None = None
    tools: Annotated[list[FunctionToolParam], Field(max_length=128)] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    max_output_tokens: TokenCount | None = None
    temperature: float = bounded("temperature", 1.0)
    top_p: float = bounded("top_p", 1.0)
    stream: bool = False
    metadata: Annotated[dict[str, Annotated[str, Field(max_length=512)]], Field(max_length=16)] | None = None
    user: EndUserId | None = None
    truncation: Literal["disabled"] | None = Field(None, description="Only 'disabled': a prompt too long is a 400")
    previous_response_id: Annotated[Any, NOT_SUPPORTED] = None
    include: Annotated[list[str], Field(max_length=64)] | None = Field(
        None,
        description=f"Only {LOGPROBS!r}: the output text's token logprobs (with top_logprobs alternatives)",
        json_schema_extra={"items": {"const": LOGPROBS}},  # others are a 400 that names them
    )
    top_logprobs: LogprobCount | None = Field(None, description=f"Alternatives per token; needs include {LOGPROBS!r}")

    @property
    def wants_logprobs(self) -> bool:
        return LOGPROBS in (self.include or [])

    def check(self) -> None:
        self.check_nothing_stored("responses")
        others = [value for value in self.include or [] if value != LOGPROBS]
        if others:
            raise BadRequest(
                f"'include' of {', '.join(repr(v) for v in others[:3])} is not supported: this server has no "
                f"extra output (reasoning, search results) to include; it can include {LOGPROBS!r}",
                "include",
            )
        if self.top_logprobs and not self.wants_logprobs:
            raise BadRequest(f"'top_logprobs' needs 'include': [{LOGPROBS!r}]", "top_logprobs")
        if self.previous_response_id is not None:
            raise BadRequest(
                "'previous_response_id' is not supported: this server stores no responses; send the "
                "whole conversation in 'input'",
                "previous_response_id",
            )

    def as_chat(self) -> ChatCompletionRequest:
        messages: list[dict[str, Any]] = []
        if self.instructions is not None:
            messages.append({"role": "system", "content": self.instructions})
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        for item in items:
            if isinstance(item, MessageItem):
                text = item.content if isinstance(item.content, str) else "".join(p.text for p in item.content)
                messages.append({"role": item.role, "content": text})
            elif isinstance(item, FunctionCallItem):
                call = {
                    "id": item.call_id,
                    "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments},
                }
                last = messages[-1] if messages else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)
                else:
                    messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            else:
                messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        chat: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            **{name: getattr(self, name) for name in ("temperature", "top_p") if name in self.model_fields_set},
            "stream": self.stream,
            "user": self.user,
            "max_tokens": self.max_output_tokens,
            "parallel_tool_calls": self.parallel_tool_calls,
        }
        if self.wants_logprobs:
            chat.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        if self.tools is not None:
            chat["tools"] = [
                {"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)} for t in self.tools
            ]
        choice = self.tool_choice
        if choice is not None:
            chat["tool_choice"] = (
                choice if isinstance(choice, str) else {"type": "function", "function": {"name": choice.name}}
            )
        fmt = self.text.format if self.text is not None else None
        if isinstance(fmt, JsonSchemaText):
            schema = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict}
            chat["response_format"] = {"type": "json_schema", "json_schema": schema}
        elif fmt is not None:
            chat["response_format"] = {"type": fmt.type}
        try:
            return ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None}, strict=False)
        except ValidationError as exc:  # the fields were checked above: only a cross-field rule gets here
            raise BadRequest(f"Invalid request: {exc.errors()[0]['msg']}", "input") from exc


RESPONSES_FIELDS = {"response_format": "text", "max_tokens": "max_output_tokens", "messages": "input"}


def token_logprobs(prompts: ChatPrompts, sample: Any) -> list[dict[str, Any]]:
    """A sample's (or a sample delta's) tokens as the Responses API's output_text logprobs."""
    if sample.logprobs is None:
        return []
    return [entry.model_dump() for entry in chat_logprobs(prompts, sample.token_ids, sample.logprobs).content]


class ResponsesService:
    def __init__(self, chat: ChatService) -> None:
        self.chat = chat

    async def create(self, body: ResponsesRequest, request: Request) -> ResponseObject | EventStream | None:
        body.check()
        try:
            prepared = await self.chat.prepare(body.as_chat())
        except BadRequest as exc:  # name the Responses API's field, not the chat one it became
            field = RESPONSES_FIELDS.get(exc.param or "")
            if field is None:
                raise
            message = exc.message.replace(f"'{exc.param}'", f"'{field}'").replace("response_format.", "text.format.")
            raise BadRequest(message, field) from exc
        end_user = body.user or body.safety_identifier
        log = RequestLog(random_id("resp"), "responses", prompt_tokens=len(prepared.token_ids), user=end_user)
        stream = self.chat.client.submit(log.request_id, prepared.token_ids, prepared.params)
        if body.stream:
            return EventStream(self._stream(log, body, prepared, stream))
        return await until_disconnected(request, self._collect(log, body, prepared, stream), log)

    def _response(
        self, log: RequestLog, body: ResponsesRequest, status: Any, output: list[dict[str, Any]]
    ) -> ResponseObject:
        return ResponseObject(
            id=log.request_id,
            created_at=int(log.created),
            status=status,
            model=self.chat.model_name,
            output=output,
            incomplete_details={"reason": "max_output_tokens"} if status == "incomplete" else None,
            instructions=body.instructions,
            max_output_tokens=body.max_output_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            tools=[t.model_dump(exclude_none=True, by_alias=True) for t in body.tools or []],
            tool_choice=body.tool_choice.model_dump()
            if isinstance(body.tool_choice, NamedFunction)
            else body.tool_choice or "auto",
            parallel_tool_calls=body.parallel_tool_calls is not False,
            text={"format": body.text.format.model_dump(by_alias=True)}
            if body.text and body.text.format
            else {"format": {"type": "text"}},
            metadata=body.metadata,
            user=body.user,
        )

    @staticmethod
    def _usage(prepared: Prepared, totals: SampleTotals) -> dict[str, Any]:
        prompt, generated = len(prepared.token_ids), totals.num_generated
        return {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": totals.num_cached_tokens},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        }

    async def _collect(
        self, log: RequestLog, body: ResponsesRequest, prepared: Prepared, stream: RequestStream
    ) -> ResponseObject:
        totals = await SampleTotals.of(1, stream, log)
        out = totals.samples[0]
        message, _ = assistant_message(prepared, out.text)
        output = []
        if message.content:
            prompts, _ = self.chat.client.check_ready()
            logprobs = token_logprobs(prompts, out) if body.wants_logprobs and not message.tool_calls else []
            output.append(message_item(random_id("msg"), message.content, "completed", logprobs))
        for call in message.tool_calls or []:
            output.append(call_item(random_id("fc"), call.id, call.function.name, call.function.arguments, "completed"))
        log.completion_tokens = totals.num_generated
        log.done(200)
        status = "incomplete" if out.finish_reason == "length" else "completed"
        response = self._response(log, body, status, output)
        response.usage = self._usage(prepared, totals)
        return response

    async def _stream(
        self, log: RequestLog, body: ResponsesRequest, prepared: Prepared, stream: RequestStream
    ) -> AsyncIterator[ServerSentEventMessage | str]:
        events = ResponseEvents()
        prompts, _ = self.chat.client.check_ready()
        totals = SampleTotals(1)
        choice = ChoiceStream(prepared)
        status: Any = 200
        try:
            yield events.event("response.created", response=self._response(log, body, "in_progress", []).model_dump())
            yield events.event(
                "response.in_progress", response=self._response(log, body, "in_progress", []).model_dump()
            )
            async with aclosing(stream):
                async for delta in stream:
                    totals.add(delta)
                    for out in delta.samples:
                        logprobs = token_logprobs(prompts, out) if body.wants_logprobs else None
                        for message in choice.feed(out.text, out.finish_reason is not None):
                            for event in events.of(message, logprobs if message.content else None):
                                yield event
                            if message.content:
                                logprobs = None  # a delta's tokens go with its first text
            for event in events.close_message():
                yield event
            final = totals.samples[0]
            response = self._response(
                log, body, "incomplete" if final.finish_reason == "length" else "completed", events.output
            )
            response.usage = self._usage(prepared, totals)
            yield events.event("response.completed", response=response.model_dump())
        except Exception as exc:  # noqa: BLE001 - the status line is sent; report in-band
            status = "error"
            yield error_event(exc, log.request_id)
        finally:
            log.completion_tokens = totals.num_generated
            log.done(status)
