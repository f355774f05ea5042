"""Tool calling over HTTP: the request's tools, how the chat template sees them, and the plan.

- ``tools`` / ``tool_choice`` / ``parallel_tool_calls``, and the legacy ``functions`` /
  ``function_call``, which map onto them (the answer then uses ``function_call`` too).
- A template that renders tools itself (it reads the ``tools`` variable) gets them, with the
  history's assistant ``tool_calls`` and ``tool`` messages as transformers passes them.
- A template that does not (SmolLM2's ChatML, for one) gets them the Hermes way
  (``ortserve.tokenizer.inject_tools``, documented in docs/design.md).
- ``ToolPlan``: the parser (from the template, or ``--tool-call-parser``), and for ``required``
  or a named function the grammar that forces a call (tool_parsers.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ortserve.sampling_params import MAX_GRAMMAR_CHARS, StructuredOutputs

from .errors import BadRequest
from .structured import JsonSchemaObject
from .tool_parsers import FORMATS, ToolCallExtractor, ToolFormat, format_for_template

FORBID = ConfigDict(extra="forbid", strict=True)
FunctionName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]
MAX_TOOLS = 128


class FunctionDefinition(BaseModel):
    model_config = FORBID
    name: FunctionName
    description: Annotated[str, Field(max_length=8192)] | None = None
    parameters: JsonSchemaObject | None = Field(None, description="JSON schema of the arguments object")
    strict: bool | None = Field(None, description="Accepted either way; forced calls always follow the schema")


class FunctionTool(BaseModel):
    model_config = FORBID
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(BaseModel):
    model_config = FORBID
    name: FunctionName


class NamedToolChoice(BaseModel):
    model_config = FORBID
    type: Literal["function"]
    function: ToolChoiceFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
FunctionCallChoice = Literal["none", "auto"] | ToolChoiceFunction
Tools = Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)]
Functions = Annotated[list[FunctionDefinition], Field(max_length=MAX_TOOLS)]


@dataclass
class ToolPlan:
    """What a request's tools mean for this generation."""

    tools: list[FunctionDefinition]
    choice: str  # "none", "auto", "required", or a function's name
    parallel: bool
    fmt: ToolFormat
    legacy: bool  # asked with functions/function_call: answer with function_call

    @property
    def parses(self) -> bool:
        return self.choice != "none"

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools as chat templates take them (none are shown for tool_choice "none")."""
        if self.choice == "none":
            return None
        return [{"type": "function", "function": t.model_dump(exclude_none=True)} for t in self.tools]

    def extractor(self) -> ToolCallExtractor | None:
        return ToolCallExtractor(self.fmt) if self.parses else None

    def forcing(self, start_token: int | None) -> StructuredOutputs | None:
        """The grammar of "required" or a named function; None when the model may answer freely."""
        if self.choice in ("none", "auto"):
            return None
        chosen = [t for t in self.tools if self.choice in ("required", t.name)]
        specs = [{"name": t.name, "parameters": t.parameters} for t in chosen]
        parallel = self.parallel and self.choice == "required"
        grammar = self.fmt.grammar(specs, parallel, start_token)
        if len(grammar) > MAX_GRAMMAR_CHARS:
            field = "functions" if self.legacy else "tools"
            raise BadRequest(
                f"forcing a call ({self.choice!r}) makes the chosen tools' parameter schemas a grammar of "
                f"{len(grammar)} characters; at most {MAX_GRAMMAR_CHARS} are allowed: send smaller schemas "
                "or fewer tools",
                field,
            )
        return StructuredOutputs(grammar=grammar)


def plan_tools(body: Any, template: str | None, parser: str) -> ToolPlan | None:
    """The request's ToolPlan (None without tools); 400 naming the field for what cannot be."""
    tools, choice, legacy = body.tools, body.tool_choice, False
    if body.functions is not None or body.function_call is not None:
        if tools is not None or choice is not None:
            raise BadRequest("give either 'tools'/'tool_choice' or the legacy 'functions'/'function_call'", "functions")
        tools = [FunctionTool(type="function", function=f) for f in body.functions or []]
        fc = body.function_call
        choice = fc if isinstance(fc, str) or fc is None else NamedToolChoice(type="function", function=fc)
        legacy = True
    name = choice.function.name if isinstance(choice, NamedToolChoice) else choice
    field = "function_call" if legacy else "tool_choice"
    if not tools:
        if name not in (None, "none", "auto"):
            raise BadRequest(f"'{field}' {name!r} needs 'tools' (or 'functions') to choose from", field)
        return None
    names = [t.function.name for t in tools]  # two of one name: a call may follow either's parameters
    if name not in (None, "none", "auto", "required") and name not in names:
        raise BadRequest(f"'{field}' names {name!r}, which is not among the tools ({', '.join(names)})", field)
    fmt = format_for_template(template) if parser == "auto" else FORMATS[parser]
    parallel = body.parallel_tool_calls is not False and not legacy
    return ToolPlan([t.function for t in tools], name or "auto", parallel, fmt, legacy)


def arguments_value(arguments: str) -> Any:
    """A past call's arguments for the template: the object when they are JSON, else the text."""
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments
