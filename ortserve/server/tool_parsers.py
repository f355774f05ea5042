"""Tool calls in generated text, per template family, and the grammar that forces them.

A ``ToolFormat`` is one family's way of writing calls:
- ``hermes`` (Hermes, Qwen 2/2.5/3 and the prompt ortserve injects for templates without tools):
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, one block per call;
- ``llama3_json`` (Llama 3.1+): the whole answer is ``{"name": ..., "parameters": {...}}``, calls
  separated by ``;``, optionally after ``<|python_tag|>``;
- ``mistral``: ``[TOOL_CALLS]`` and then a JSON array of ``{"name", "arguments"}``.

``ToolCallExtractor`` reads a sample's text as it streams and yields content pieces and whole
calls; the non-streamed response runs the same extractor over the whole text, so a streamed call
reassembles into exactly the non-streamed one. Text that looks like a call but does not parse is
returned as content. ``grammar()`` writes the Lark grammar (with llguidance's inline ``%json``)
that ``tool_choice`` "required" or a named function imposes, so such output always parses.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ParsedCall:
    name: str
    arguments: str  # JSON text of an object
    id: str = field(default_factory=call_id)


@dataclass
class ToolFormat:
    name: str
    start: str  # opens the calls
    end: str | None  # closes one call (hermes); None = the calls run to the end of the output
    arguments_key: str = "arguments"
    at_start_only: bool = False  # the calls must begin the output (llama3_json's bare "{")
    separator: str = "\n"  # between calls, in the forcing grammar

    def parse_payload(self, payload: str) -> list[ParsedCall] | None:
        """The calls written in ``payload`` (the text after ``start``, and before ``end``), or None."""
        try:
            values = _json_values(payload)
        except ValueError:
            return None
        if self.name == "mistral" and len(values) == 1 and isinstance(values[0], list):
            values = values[0]
        calls = []
        for value in values:
            if not isinstance(value, dict) or not isinstance(value.get("name"), str):
                return None
            arguments = value.get(self.arguments_key, value.get("arguments", value.get("parameters", {})))
            if not isinstance(arguments, dict):
                return None
            calls.append(ParsedCall(value["name"], json.dumps(arguments, ensure_ascii=False)))
        return calls or None

    def grammar(self, tools: Sequence[dict[str, Any]], parallel: bool, start_token: int | None = None) -> str:
        """A Lark grammar whose every sentence is one call (or several when ``parallel``) of
        ``tools`` ({"name", "parameters"}). ``start_token``: ``start`` is this special token."""
        options = [
            {
                "type": "object",
                "properties": {
                    "name": {"const": tool["name"]},
                    self.arguments_key: tool.get("parameters") or {"type": "object", "properties": {}},
                },
                "required": ["name", self.arguments_key],
                "additionalProperties": False,
            }
            for tool in tools
        ]
        call = {"anyOf": options} if len(options) > 1 else options[0]
        opener = f"<[{start_token}]>" if start_token is not None else json.dumps(self.start)
        if self.name == "mistral":
            array = {"type": "array", "items": call, "minItems": 1, **({} if parallel else {"maxItems": 1})}
            return f"start: {opener} %json {json.dumps({**array, 'x-guidance': JSON_STYLE})}\n"
        body = f"%json {json.dumps({**call, 'x-guidance': JSON_STYLE})}"
        if self.end is not None:
            body = f'{opener} "\\n" {body} "\\n" {json.dumps(self.end)}'
        repeat = f" ({json.dumps(self.separator)} call)*" if parallel else ""
        return f"start: call{repeat}\ncall: {body}\n"


FORMATS = {
    "hermes": ToolFormat("hermes", "<tool_call>", "</tool_call>"),
    "llama3_json": ToolFormat("llama3_json", "<|python_tag|>", None, "parameters", at_start_only=True, separator="; "),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", None),
}


def format_for_template(template: str | None) -> ToolFormat:
    """The family a chat template writes calls in (hermes also for templates without tools)."""
    text = template or ""
    if "[TOOL_CALLS]" in text:
        return FORMATS["mistral"]
    if "<|python_tag|>" in text or ("ipython" in text and "<tool_call>" not in text):
        return FORMATS["llama3_json"]
    return FORMATS["hermes"]


def _json_values(text: str) -> list[Any]:
    """The JSON values in ``text``, separated by whitespace or ';' (ValueError otherwise)."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i] in " \t\r\n;":
            i += 1
        if i == len(text):
            return values
        value, i = decoder.raw_decode(text, i)
        values.append(value)


@dataclass
class Content:
    text: str


class ToolCallExtractor:
    """Content and calls from one sample's text deltas (``feed`` then ``finish``)."""

    def __init__(self, fmt: ToolFormat) -> None:
        self.fmt = fmt
        self.buffer = ""
        self.in_call = False
        self.decided = not fmt.at_start_only  # llama3_json: has the output shown how it begins?
        self.calls: list[ParsedCall] = []

    def feed(self, text: str) -> list[Content | ParsedCall]:
        self.buffer += text
        events: list[Content | ParsedCall] = []
        fmt = self.fmt
        while True:
            if not self.decided:
                head = self.buffer.lstrip()
                if not head:
                    return _nonempty(events)
                if head.startswith("{") or head.startswith(fmt.start):
                    self.in_call = self.decided = True
                    self.buffer = head.removeprefix(fmt.start)
                elif fmt.start.startswith(head):
                    return _nonempty(events)  # maybe the start of <|python_tag|>
                else:
                    self.decided = True
            if self.in_call:
                if fmt.end is None or fmt.end not in self.buffer:
                    return _nonempty(events)  # the call is not complete yet
                payload, self.buffer = self.buffer.split(fmt.end, 1)
                self.in_call = False
                events += self._calls(payload, fmt.start + payload + fmt.end)
                continue
            if fmt.at_start_only:  # plain content from here on
                events.append(Content(self.buffer))
                self.buffer = ""
                return _nonempty(events)
            head, found, rest = self.buffer.partition(fmt.start)
            if found:
                events.append(Content(head))
                self.buffer, self.in_call = rest, True
                continue
            keep = _partial_suffix(self.buffer, fmt.start)
            events.append(Content(self.buffer[: len(self.buffer) - keep]))
            self.buffer = self.buffer[len(self.buffer) - keep :]
            return _nonempty(events)

    def finish(self) -> list[Content | ParsedCall]:
        """The rest, once the sample ended: an unclosed call still counts if it parses."""
        events: list[Content | ParsedCall] = []
        if self.in_call:
            events = self._calls(self.buffer, (self.fmt.start if self.fmt.end else "") + self.buffer)
        elif self.buffer:
            events = [Content(self.buffer)]
        self.buffer = ""
        return _nonempty(events)

    def _calls(self, payload: str, raw: str) -> list[Content | ParsedCall]:
        calls = self.fmt.parse_payload(payload)
        if calls is None:
            return [Content(raw)]
        self.calls += calls
        return list(calls)


def _nonempty(events: list[Content | ParsedCall]) -> list[Content | ParsedCall]:
    return [e for e in events if not isinstance(e, Content) or e.text]


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of ``text`` that begins ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
