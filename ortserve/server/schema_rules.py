"""Rules across a request's fields, written as JSON Schema for the OpenAPI schema (the request
models' ``json_schema_extra``). The server checks each in code too, with a 400 naming the field;
tests/server/test_openapi_schema.py checks that the two agree. What no JSON Schema can state (a
named tool among the tools, a grammar that compiles, the context's room) is only checked in code."""

from __future__ import annotations

from typing import Any


def requires(field: str, condition: dict[str, Any], then_field: str, value: Any) -> dict[str, Any]:
    """A JSON Schema rule: when ``field`` matches ``condition``, ``then_field`` must be ``value``."""
    return {
        "if": {"properties": {field: condition}, "required": [field]},
        "then": {"properties": {then_field: {"const": value}}, "required": [then_field]},
    }


STREAM_OPTIONS_NEED_STREAM = requires("stream_options", {"type": "object"}, "stream", True)
NOT_NULL = {"not": {"type": "null"}}


def at_most_one(conditions: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """JSON Schema rules: no two of these fields meet their condition at once."""
    names = list(conditions)
    return [
        {"not": {"properties": {a: conditions[a], b: conditions[b]}, "required": [a, b]}}
        for i, a in enumerate(names)
        for b in names[i + 1 :]
    ]


def at_least(field: str, other: str, upper: int) -> dict[str, Any]:
    """JSON Schema rule: ``field`` >= ``other`` when both are given (integers up to ``upper``).
    JSON Schema cannot compare two values; this says "some k has other <= k <= field"."""
    return {"anyOf": [{"properties": {other: {"maximum": k}, field: {"minimum": k}}} for k in range(1, upper + 1)]}


# Only one field may constrain the output (structured.one_of); response_format "text" does not.
CONSTRAINS_OUTPUT = {
    "response_format": {"type": "object", "properties": {"type": {"enum": ["json_object", "json_schema"]}}},
    **dict.fromkeys(("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar"), NOT_NULL),
}
FORCED_TOOL = {"anyOf": [{"const": "required"}, {"type": "object"}]}


def needs_nonempty(field: str, condition: dict[str, Any], needed: str) -> dict[str, Any]:
    """JSON Schema rule: when ``field`` matches ``condition``, ``needed`` is a non-empty list."""
    return {
        "if": {"properties": {field: condition}, "required": [field]},
        "then": {"properties": {needed: {"type": "array", "minItems": 1}}, "required": [needed]},
    }


# Chat's tool rules: tools exclude the legacy functions API; a forced call needs something to call,
# and its grammar leaves no room for another output constraint (the Responses API states its own
# two in responses_api.py). A named tool being among the tools compares two values, which no JSON
# Schema can state. schemathesis's generator cannot carry all of chat's rules at once; its run
# applies them as a filter (tests/reliability/schemathesis_hooks.py).
CHAT_TOOL_RULES = [
    *(
        rule
        for new in ("tools", "tool_choice")
        for legacy in ("functions", "function_call")
        for rule in at_most_one({new: NOT_NULL, legacy: NOT_NULL})
    ),
    needs_nonempty("tool_choice", FORCED_TOOL, "tools"),
    needs_nonempty("function_call", {"type": "object"}, "functions"),
    *(
        {"not": {"properties": {forcing: condition, name: constraint}, "required": [forcing, name]}}
        for forcing, condition in (("tool_choice", FORCED_TOOL), ("function_call", {"type": "object"}))
        for name, constraint in CONSTRAINS_OUTPUT.items()
    ),
]
