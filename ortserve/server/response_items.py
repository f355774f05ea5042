"""The Responses API's output: the response object, its output items (a ``message`` with
``output_text``, a ``function_call``), and the typed stream events that build them
(``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta``
/ ``.done``, ``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``),
each with its ``sequence_number``. responses_api.py sends them."""

from __future__ import annotations

import json
from typing import Any, Literal

from litestar.response import ServerSentEventMessage
from pydantic import BaseModel, Field

from .responses import DeltaMessage, random_id


class ResponseObject(BaseModel):
    """The response (``object: "response"``), as OpenAI's SDKs read it."""

    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: Literal["in_progress", "completed", "incomplete"]
    model: str
    output: list[dict[str, Any]]
    usage: dict[str, Any] | None = None
    incomplete_details: dict[str, str] | None = None
    error: None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict[str, Any]] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    metadata: dict[str, str] | None = None
    previous_response_id: None = None
    store: bool = False
    truncation: str = "disabled"
    user: str | None = None


def message_item(item_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``logprobs``: the output text's tokens (with include: message.output_text.logprobs)."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}
    content = [part] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


class ResponseEvents:
    """The typed stream events of one response's output, with their sequence numbers."""

    def __init__(self) -> None:
        self.sequence = 0
        self.output: list[dict[str, Any]] = []  # finished items
        self.message_id: str | None = None  # the open message item
        self.text = ""
        self.logprobs: list[dict[str, Any]] = []  # the open message's tokens, when asked
        self.pending_call: dict[str, Any] | None = None

    def event(self, kind: str, **fields: Any) -> ServerSentEventMessage:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return ServerSentEventMessage(data=json.dumps(payload, ensure_ascii=False), event=kind)

    def of(self, delta: DeltaMessage, logprobs: list[dict[str, Any]] | None = None) -> list[ServerSentEventMessage]:
        """``logprobs``: those of the tokens behind ``delta`` (its text's, when it has text)."""
        events = []
        if delta.content:
            if self.message_id is None:
                self.message_id, self.text, self.logprobs = random_id("msg"), "", []
                index = len(self.output)
                events.append(
                    self.event(
                        "response.output_item.added",
                        output_index=index,
                        item=message_item(self.message_id, "", "in_progress"),
                    )
                )
                part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                events.append(
                    self.event(
                        "response.content_part.added",
                        item_id=self.message_id,
                        output_index=index,
                        content_index=0,
                        part=part,
                    )
                )
            self.text += delta.content
            self.logprobs += logprobs or []
            events.append(
                self.event(
                    "response.output_text.delta",
                    item_id=self.message_id,
                    output_index=len(self.output),
                    content_index=0,
                    delta=delta.content,
                    logprobs=logprobs or [],
                )
            )
        for call in delta.tool_calls or []:
            if call.id is not None:  # a call's first delta: its name
                events += self.close_message()
                item = call_item(random_id("fc"), call.id, call.function.name or "", "", "in_progress")
                self.pending_call = item
                events.append(self.event("response.output_item.added", output_index=len(self.output), item=item))
            elif self.pending_call is not None:
                item, self.pending_call = self.pending_call, None
                item["arguments"] = arguments = call.function.arguments or ""
                index = len(self.output)
                events.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=item["id"],
                        output_index=index,
                        delta=arguments,
                    )
                )
                events.append(
                    self.event(
                        "response.function_call_arguments.done",
                        item_id=item["id"],
                        output_index=index,
                        arguments=arguments,
                        name=item["name"],
                    )
                )
                item["status"] = "completed"
                self.output.append(item)
                events.append(self.event("response.output_item.done", output_index=index, item=item))
        return events

    def close_message(self) -> list[ServerSentEventMessage]:
        if self.message_id is None:
            return []
        index, item_id, text = len(self.output), self.message_id, self.text
        self.message_id = None
        item = message_item(item_id, text, "completed", self.logprobs)
        part = item["content"][0]
        self.output.append(item)
        return [
            self.event(
                "response.output_text.done",
                item_id=item_id,
                output_index=index,
                content_index=0,
                text=text,
                logprobs=self.logprobs,
            ),
            self.event("response.content_part.done", item_id=item_id, output_index=index, content_index=0, part=part),
            self.event("response.output_item.done", output_index=index, item=item),
        ]
