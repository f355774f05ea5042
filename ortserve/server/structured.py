"""Structured outputs over HTTP: the request fields that ask for them, and one ``StructuredOutputs``.

Four spellings reach the same engine feature (``SamplingParams.structured_outputs``, compiled by
llguidance in the engine process, docs/design.md §3):
- OpenAI's ``response_format``: ``{"type": "json_object"}``, or ``{"type": "json_schema",
  "json_schema": {"name", "schema", "strict"}}`` (``text`` asks for nothing);
- vLLM's ``structured_outputs``: ``{"json" | "regex" | "choice" | "grammar" | "json_object"}``;
- vLLM's older ``guided_json``, ``guided_regex``, ``guided_choice``, ``guided_grammar``;
- a tool choice of ``required`` or a named function (tools.py writes that grammar).

At most one may be given. The grammar is checked by llguidance off the event loop before the
request is sent; a rejection is a 400 naming the field it came from and llguidance's reason.
Every schema is enforced whether or not ``strict`` is set (a superset of OpenAI's best effort).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ortserve.sampling_params import BOUNDS, MAX_GRAMMAR_CHARS, InvalidParameter, StructuredOutputs

from .errors import BadRequest

FORBID = ConfigDict(extra="forbid", strict=True)  # an option we would not honour is a 400, not ignored
# Whether a text compiles is no JSON Schema keyword; the OpenAPI schema says which language each
# is in by its ``format`` (llguidance's regex syntax, its Lark grammars or GBNF, a JSON schema's text).
REGEX_FORMAT, GRAMMAR_FORMAT, JSON_SCHEMA_TEXT_FORMAT = "llguidance-regex", "llguidance-grammar", "json-schema-text"


def _text(language: str) -> Any:
    return Annotated[str, Field(max_length=MAX_GRAMMAR_CHARS, json_schema_extra={"format": language})]


RegexText, GrammarText, SchemaText = _text(REGEX_FORMAT), _text(GRAMMAR_FORMAT), _text(JSON_SCHEMA_TEXT_FORMAT)
JSON_SCHEMA_FORMAT = "json-schema"  # an object that is a JSON schema (of the keywords llguidance implements)
JsonSchemaObject = Annotated[dict[str, Any], Field(json_schema_extra={"format": JSON_SCHEMA_FORMAT})]
Choice = Annotated[
    list[Annotated[str, Field(max_length=BOUNDS["choice"].max_length)]],
    Field(min_length=1, max_length=BOUNDS["choice"].max_items),
]
Schema = JsonSchemaObject | SchemaText  # a JSON schema, or its JSON text
REJECTED = "the grammar compiler rejected it"  # in every 400 about a grammar's content


class TextFormat(BaseModel):
    model_config = FORBID
    type: Literal["text"]


class JsonObjectFormat(BaseModel):
    model_config = FORBID
    type: Literal["json_object"]


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: Annotated[str, Field(max_length=64)] = "response"
    description: str | None = None
    schema_: JsonSchemaObject | None = Field(None, alias="schema", description="The JSON schema; absent = any object")
    strict: bool | None = Field(None, description="Accepted either way: the schema is always enforced")


class JsonSchemaFormat(BaseModel):
    model_config = FORBID
    type: Literal["json_schema"]
    json_schema: JsonSchema


ResponseFormat = Annotated[TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")]


def _exactly_one(fields: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """JSON Schema: exactly one of ``fields`` meets its condition."""
    return {"oneOf": [{"properties": {name: condition}, "required": [name]} for name, condition in fields.items()]}


class StructuredOutputsRequest(BaseModel):
    """vLLM's ``structured_outputs`` object: exactly one of its fields."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra=_exactly_one(
            {
                "json": {"type": ["object", "string"]},
                "regex": {"type": "string"},
                "choice": {"type": "array"},
                "grammar": {"type": "string"},
                "json_object": {"const": True},
            }
        ),
    )
    json_: Schema | None = Field(None, alias="json", description="A JSON schema")
    regex: RegexText | None = None
    choice: Choice | None = None
    grammar: GrammarText | None = Field(None, description="A Lark (llguidance) or GBNF grammar")
    json_object: bool | None = Field(None, description="true = any JSON object")

    def spec(self) -> StructuredOutputs:
        return StructuredOutputs(
            json=self.json_,
            regex=self.regex,
            choice=self.choice,
            grammar=self.grammar,
            json_object=bool(self.json_object),
        )


# The fields of a request that ask for structured outputs, each with the spec it gives.
STRUCTURED_FIELDS = (
    "response_format",
    "structured_outputs",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
)


def requested(body: Any) -> list[tuple[str, StructuredOutputs]]:
    """(field, spec) for each structured-output field set in ``body`` (a request model)."""
    found = []
    fmt = body.response_format
    if isinstance(fmt, JsonObjectFormat):
        found.append(("response_format", StructuredOutputs(json_object=True)))
    elif isinstance(fmt, JsonSchemaFormat):
        schema = fmt.json_schema.schema_
        with as_field_error("response_format"):
            spec = StructuredOutputs(json=schema) if schema is not None else StructuredOutputs(json_object=True)
        found.append(("response_format", spec))
    if body.structured_outputs is not None:
        with as_field_error("structured_outputs"):
            found.append(("structured_outputs", body.structured_outputs.spec()))
    legacy = (
        ("guided_json", "json"),
        ("guided_regex", "regex"),
        ("guided_choice", "choice"),
        ("guided_grammar", "grammar"),
    )
    for field, kind in legacy:
        value = getattr(body, field)
        if value is not None:
            with as_field_error(field):
                found.append((field, StructuredOutputs(**{kind: value})))
    return found


def one_of(found: list[tuple[str, StructuredOutputs]]) -> tuple[str, StructuredOutputs] | None:
    if len(found) > 1:
        names = ", ".join(f"'{f}'" for f, _ in found)
        raise BadRequest(f"{names} each constrain the output; give only one of them", found[1][0])
    return found[0] if found else None


async def checked(field: str, spec: StructuredOutputs) -> StructuredOutputs:
    """``spec`` once llguidance accepts it (compiled off the event loop), else a 400 naming ``field``."""
    from ortserve.engine.grammar import check  # llguidance: loaded on the first structured request

    with as_field_error(field):
        await asyncio.to_thread(check, spec)
    return spec


@contextmanager
def as_field_error(field: str) -> Iterator[None]:
    """InvalidParameter about a grammar -> a 400 naming the request field it came from."""
    try:
        yield
    except InvalidParameter as exc:
        message = str(exc).replace("structured_outputs", field, 1)
        if " is invalid: " in message:
            message = message.replace(" is invalid: ", f" is invalid ({REJECTED}): ", 1)
        raise BadRequest(f"Invalid '{field}': {message}", field) from exc
