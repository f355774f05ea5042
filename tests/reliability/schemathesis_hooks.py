"""schemathesis hooks for the run against the server's OpenAPI schema (SCHEMATHESIS_HOOKS).

- Formats. Whether a text compiles is no JSON Schema keyword, so the schema names each text's
  language by ``format`` (ortserve/server/structured.py); these strategies write valid texts of
  each, as schemathesis's documentation says to do for a custom format.
  Objects that are JSON schemas say ``format: json-schema``; schemathesis registers formats of
  strings only, so the generator's copy describes them instead (JSON_SCHEMA_SHAPE: schemas of the
  kinds clients send, each of which compiles).
  schemathesis's coverage phase uses a format's strategy only for a bare ``{type, format}``, so
  the generator's copy of the schema leaves out these texts' ``maxLength`` (65,536 characters,
  which the strategies' texts never approach; tests/server checks that bound).
- Chat's cross-field rules. The schema states them all, but jsonschema_rs's canonical form (which
  schemathesis generates from) gives up on the chat operation with all of them at once. So the
  generator gets chat's schema without its ``allOf`` rules, and a positive case is kept only if
  jsonschema validates it against the schema as served: the rules come from the server's schema,
  not from here.
- The one rule no JSON Schema can state: a named tool (``tool_choice`` or ``function_call``) is
  one of the request's tools, since that compares two values of the request.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import schemathesis
from hypothesis import strategies as st

LETTERS = st.sampled_from("abcxyz019 ")

# llguidance's regex syntax (Rust's regex crate): literals, classes, groups, alternation, repeats
_regex_atom = st.one_of(LETTERS, st.sampled_from(["[a-z]", "[0-9]", "\\d", "\\w", "[A-Fa-f0-9]"]))
REGEX = st.recursive(
    _regex_atom,
    lambda inner: st.one_of(
        st.lists(inner, min_size=1, max_size=4).map("".join),
        st.tuples(inner, inner).map(lambda ab: f"({ab[0]}|{ab[1]})"),
        st.tuples(inner, st.sampled_from(["?", "*", "+", "{1,3}"])).map(lambda t: f"({t[0]}){t[1]}"),
    ),
    max_leaves=8,
)

# llguidance's Lark: a start rule over quoted literals and regex terminals
_lark_item = st.one_of(
    st.text(st.sampled_from("abcxyz019 "), min_size=1, max_size=6).map(json.dumps),
    REGEX.map(lambda r: f"/{r}/"),
)
_lark_sequence = st.lists(_lark_item, min_size=1, max_size=3).map(" ".join)
GRAMMAR = st.lists(_lark_sequence, min_size=1, max_size=3).map(lambda alts: "start: " + " | ".join(alts))

# JSON schemas of the kinds clients send
_leaf_schema = st.one_of(
    st.just({"type": "string"}),
    st.integers(-100, 100).map(lambda low: {"type": "integer", "minimum": low}),
    st.just({"type": "boolean"}),
    st.lists(st.text("abc", min_size=1, max_size=4), min_size=1, max_size=3, unique=True).map(lambda e: {"enum": e}),
)
JSON_SCHEMA = st.recursive(
    _leaf_schema,
    lambda inner: st.one_of(
        st.dictionaries(st.text("abcdef", min_size=1, max_size=5), inner, min_size=1, max_size=3).map(
            lambda props: {"type": "object", "properties": props, "required": sorted(props)[:1]}
        ),
        inner.map(lambda items: {"type": "array", "items": items, "maxItems": 3}),
    ),
    max_leaves=5,
)

FORMATS = {"llguidance-regex": REGEX, "llguidance-grammar": GRAMMAR, "json-schema-text": JSON_SCHEMA.map(json.dumps)}
for name, strategy in FORMATS.items():
    schemathesis.openapi.format(name, strategy)

_PROPERTY = {
    "type": "object",
    "properties": {"type": {"enum": ["string", "integer", "boolean", "number"]}},
    "required": ["type"],
    "additionalProperties": False,
}
JSON_SCHEMA_SHAPE = {
    "type": "object",
    "properties": {
        "type": {"enum": ["string", "integer", "number", "boolean", "object", "array"]},
        "description": {"type": "string", "maxLength": 20},
        "properties": {"type": "object", "maxProperties": 3, "additionalProperties": _PROPERTY},
        "required": {"type": "array", "maxItems": 2, "items": {"type": "string", "maxLength": 5}},
    },
    "additionalProperties": False,
}
RELAXED = {"/v1/chat/completions": "ChatCompletionRequest"}  # operation -> its body's schema
AS_SERVED = "x-as-served"  # the components as served, for the filter


@schemathesis.hook
def before_load_schema(context: Any, raw_schema: dict[str, Any]) -> None:
    schemas = raw_schema["components"]["schemas"]
    raw_schema[AS_SERVED] = copy.deepcopy(raw_schema["components"])
    for name in RELAXED.values():
        schemas[name].pop("allOf")
    bare_formats(schemas)


def bare_formats(node: Any) -> None:
    """The generator's copy: format texts without maxLength, JSON-schema objects as their shape."""
    if isinstance(node, dict):
        if isinstance(node.get("format"), str) and node["format"] in FORMATS:
            node.pop("maxLength", None)
        if node.get("format") == "json-schema":
            node.clear()
            node.update(copy.deepcopy(JSON_SCHEMA_SHAPE))
        for child in node.values():
            bare_formats(child)
    elif isinstance(node, list):
        for child in node:
            bare_formats(child)


@schemathesis.hook
def filter_case(context: Any, case: Any) -> bool:
    """A positive case must be valid against the schema as served (and name a listed tool); a
    negative one invalid against it (the generator's copy is narrower for JSON-schema objects)."""
    body = case.body
    if case.meta is None or not isinstance(body, dict) or "requestBody" not in case.operation.definition.raw:
        return True
    media = case.operation.definition.raw["requestBody"]["content"]["application/json"]["schema"]
    served = {**media, "components": case.operation.schema.raw_schema[AS_SERVED]}
    valid = jsonschema.Draft202012Validator(served).is_valid(body)
    if case.meta.generation.mode.is_positive:
        return valid and names_a_listed_tool(body)
    return not valid


def names_a_listed_tool(body: dict[str, Any]) -> bool:
    """False when tool_choice or function_call names a function that the tools do not have."""
    choice, function_call = body.get("tool_choice"), body.get("function_call")
    named = (choice.get("function") or choice if isinstance(choice, dict) else {}).get("name")
    named = named or (function_call.get("name") if isinstance(function_call, dict) else None)
    if named is None:
        return True
    tools = body.get("tools") or body.get("functions") or []
    names = {(t.get("function") or t).get("name") for t in tools if isinstance(t, dict)}
    return named in names
