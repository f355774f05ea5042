"""The served OpenAPI schema and the server agree: jsonschema's verdict on each body of the table
(against /schema/openapi.json, as served) is the server's (400 or not), for the cross-field rules
and the loaded model's vocabulary. schemathesis (tests/reliability) generates from the same schema."""

from __future__ import annotations

import re

import httpx
import jsonschema
import pytest

from ortserve.server.openapi import decimal_range

VOCAB = 49152  # the fake engine's
MESSAGES = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
GRAMMAR = 'start: "a"'

# (case, route, body fields, valid per the schema and accepted by the server)
CASES = [
    ("a token id at the vocabulary's end", COMPLETIONS, {"prompt": [VOCAB - 1]}, True),
    ("a token id past it", COMPLETIONS, {"prompt": [VOCAB]}, False),
    ("a stop token past it", COMPLETIONS, {"prompt": "hi", "stop_token_ids": [VOCAB]}, False),
    ("a logit_bias key at the end", COMPLETIONS, {"prompt": "hi", "logit_bias": {str(VOCAB - 1): 1.0}}, True),
    ("a logit_bias key past it", COMPLETIONS, {"prompt": "hi", "logit_bias": {str(VOCAB): 1.0}}, False),
    ("a logit_bias key with a leading zero", COMPLETIONS, {"prompt": "hi", "logit_bias": {"07": 1.0}}, False),
    ("best_of = n", COMPLETIONS, {"prompt": "hi", "n": 3, "best_of": 3}, True),
    ("best_of < n", COMPLETIONS, {"prompt": "hi", "n": 3, "best_of": 2}, False),
    ("best_of without n", COMPLETIONS, {"prompt": "hi", "best_of": 2}, True),
    ("n without best_of", COMPLETIONS, {"prompt": "hi", "n": 5}, True),
    ("two output constraints", COMPLETIONS, {"prompt": "hi", "guided_regex": "a", "guided_choice": ["a"]}, False),
    ("text format beside a regex", COMPLETIONS, {"guided_regex": "a", "response_format": {"type": "text"}}, True),
    ("json_object beside a choice", CHAT, {"response_format": {"type": "json_object"}, "guided_choice": ["a"]}, False),
    ("a forced call without tools", CHAT, {"tool_choice": "required"}, False),
    ("a forced call with tools", CHAT, {"tools": [TOOL], "tool_choice": "required"}, True),
    ("forced, and a grammar", CHAT, {"tools": [TOOL], "tool_choice": "required", "guided_grammar": GRAMMAR}, False),
    ("auto beside a grammar", CHAT, {"tools": [TOOL], "tool_choice": "auto", "guided_grammar": GRAMMAR}, True),
    ("a named function_call without functions", CHAT, {"function_call": {"name": "f"}}, False),
    ("tools and functions", CHAT, {"tools": [TOOL], "functions": [TOOL["function"]]}, False),
    ("top_logprobs without logprobs", CHAT, {"top_logprobs": 2}, False),
    ("continue and a generation prompt", CHAT, {"continue_final_message": True}, False),
    ("continue a user message", CHAT, {"continue_final_message": True, "add_generation_prompt": False}, True),
    ("stream_options without stream", CHAT, {"stream_options": {"include_usage": True}}, False),
    ("max_tokens past the context (ends there)", CHAT, {"max_tokens": 10**6}, True),
]  # fmt: skip


@pytest.fixture(scope="module")
def served(tokenizer_dir):
    from server_process import ServerProcess

    proc = ServerProcess.fake(tokenizer_dir, "--step-seconds", "0.001")
    proc.wait_ready(60)
    try:
        yield proc, httpx.get(f"{proc.base_url}/schema/openapi.json").json()
    finally:
        proc.stop(30)


def validator(schema: dict, route: str) -> jsonschema.Draft202012Validator:
    body = schema["paths"][route]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return jsonschema.Draft202012Validator({**body, "components": schema["components"]})


@pytest.mark.parametrize("route, fields, valid", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_schema_and_the_server_agree(served, route, fields, valid):
    proc, schema = served
    body = {
        "model": "fake",
        "max_tokens": 2,
        **({"messages": MESSAGES} if route == CHAT else {"prompt": "hi"}),
        **fields,
    }
    assert validator(schema, route).is_valid(body) == valid
    response = httpx.post(f"{proc.base_url}{route}", json=body, timeout=30)
    assert (response.status_code == 200) == valid, response.text
    if not valid:
        assert response.status_code == 400, response.text


@pytest.mark.parametrize("upper", [0, 7, 9, 10, 99, 100, 255, 1000, 32767, 49151, 151935])
def test_the_vocabulary_key_pattern_matches_exactly_the_ids_below_it(upper):
    pattern = re.compile(f"^({decimal_range(upper)})$")
    for number in range(0, min(upper * 3 + 30, 400_000)):
        assert bool(pattern.match(str(number))) == (number <= upper), number
    assert not pattern.match("0" + str(upper))
