"""No field is silently ignored. Each field that used to be accepted and ignored (issue #13) is now
honoured (checked against what it asks for) or refused with a 400 naming it; an unknown top-level
field is a 400 naming it unless the server runs with --allow-extra-fields."""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import pytest
from conftest import TINY_NAME

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Hello there"}]
SCHEMA = {
    "type": "object",
    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["n"],
    "additionalProperties": False,
}
FUNCTION = {"name": "lookup", "parameters": SCHEMA}


def chat(**fields):
    return {"model": TINY_NAME, "messages": MESSAGES, "max_tokens": 40, "seed": 1, **fields}


def completion(**fields):
    return {"model": TINY_NAME, "prompt": "Once upon a time there was", "max_tokens": 40, "seed": 1, **fields}


def text_of(body: dict) -> str:
    choice = body["choices"][0]
    return choice["text"] if "text" in choice else choice["message"]["content"]


def honoured_best_of(server, body: dict) -> None:
    """best_of=4, n=1 returns the sample of highest cumulative logprob among the 4 that n=4 draws
    with the same seed (each sample's draws depend only on the seed and its index)."""
    four = post(server, COMPLETIONS, completion(n=4, logprobs=0, temperature=1.0)).json()
    best = max(four["choices"], key=lambda c: sum(c["logprobs"]["token_logprobs"]))
    assert [c["text"] for c in body["choices"]] == [best["text"]]
    assert body["choices"][0]["logprobs"] is None  # not asked: used, not returned


def fits_schema(server, body: dict) -> None:
    jsonschema.validate(json.loads(text_of(body)), SCHEMA)


def called_once(server, body: dict) -> None:
    message = body["choices"][0]["message"]
    [call] = message["tool_calls"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)


def called_function(server, body: dict) -> None:
    jsonschema.validate(json.loads(body["choices"][0]["message"]["function_call"]["arguments"]), SCHEMA)


def echoed_prompt_logprobs(server, body: dict) -> None:
    values = body["choices"][0]["logprobs"]["token_logprobs"]
    assert values[0] is None and all(isinstance(x, float) for x in values[1:])


def prompt_of(k: int):
    return lambda server, body: body["usage"]["prompt_tokens"] == k


REGEX = "[xyz]{3}"
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}
CONTINUED = [*MESSAGES, {"role": "assistant", "content": "Well,"}]
CONTINUE = dict(messages=CONTINUED, echo=True, add_generation_prompt=False, continue_final_message=True)
TOOL = {"type": "function", "function": FUNCTION}

# (field, route, body, expectation): a check of the 200 answer, or the param a 400 must name
TABLE = [
    ("guided_json", COMPLETIONS, completion(guided_json=SCHEMA), fits_schema),
    ("guided_regex", COMPLETIONS, completion(guided_regex=REGEX), lambda s, b: re.fullmatch(REGEX, text_of(b))),
    ("guided_choice", CHAT, chat(guided_choice=["up", "down"]), lambda s, b: text_of(b) in ("up", "down")),
    ("guided_grammar", CHAT, chat(guided_grammar='start: "a" "b"{2}'), lambda s, b: text_of(b) == "abb"),
    ("structured_outputs", CHAT, chat(structured_outputs={"json": SCHEMA}), fits_schema),
    ("response_format", CHAT, chat(response_format=JSON_SCHEMA_FORMAT), fits_schema),
    ("functions, function_call", CHAT, chat(functions=[FUNCTION], function_call={"name": "lookup"}), called_function),
    ("tools, tool_choice", CHAT, chat(tools=[TOOL], tool_choice="required", parallel_tool_calls=False), called_once),
    ("best_of", COMPLETIONS, completion(best_of=4, temperature=1.0), honoured_best_of),
    ("best_of while streaming", COMPLETIONS, completion(best_of=2, stream=True), "best_of"),
    ("truncate_prompt_tokens", COMPLETIONS, completion(truncate_prompt_tokens=3, echo=True),
     lambda s, b: prompt_of(3)(s, b) and b["choices"][0]["text"].startswith(" time there was")),
    ("truncate_prompt_tokens on chat", CHAT, chat(truncate_prompt_tokens=5), prompt_of(5)),
    ("modalities: text", CHAT, chat(modalities=["text"]), lambda s, b: text_of(b)),
    ("modalities: audio", CHAT, chat(modalities=["audio"]), "modalities"),
    ("prediction", CHAT, chat(prediction={"type": "content", "content": "Hello"}), "prediction"),
    ("echo on chat", CHAT, chat(**CONTINUE), lambda s, b: text_of(b).startswith("Well,") and len(text_of(b)) > 5),
    ("echo with logprobs", COMPLETIONS, completion(echo=True, logprobs=1, max_tokens=1), echoed_prompt_logprobs),
    ("prompt_logprobs", CHAT, chat(prompt_logprobs=1), lambda s, b: b["prompt_logprobs"][0] is None),
    ("user", CHAT, chat(user="user-4711"), lambda s, b: s.wait_output("user='user-4711'")),
    ("suffix", COMPLETIONS, completion(suffix="The end."), "suffix"),
    ("safety_identifier", CHAT, chat(safety_identifier="sid-4712"), lambda s, b: s.wait_output("user='sid-4712'")),
    ("prompt_cache_key", CHAT, chat(prompt_cache_key="k1"), lambda s, b: text_of(b)),
    ("service_tier: auto", CHAT, chat(service_tier="auto"), lambda s, b: text_of(b)),
    ("service_tier: flex", CHAT, chat(service_tier="flex"), "service_tier"),
    ("store: false", CHAT, chat(store=False), lambda s, b: text_of(b)),
    ("store: true", CHAT, chat(store=True), "store"),
    ("an unknown field", CHAT, chat(verbosity="low"), "verbosity"),
]  # fmt: skip


def post(server, route: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{route}", json=body, timeout=120)


@pytest.mark.parametrize(("route", "body", "expect"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE])
def test_each_once_ignored_field_is_honoured_or_refused_by_name(tiny_server, route, body, expect):
    response = post(tiny_server, route, body)
    if isinstance(expect, str):
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == expect and expect in error["message"]
        return
    assert response.status_code == 200, response.text
    result = expect(tiny_server, response.json())
    assert result is None or result


def test_the_schema_declares_that_unknown_fields_are_refused(tiny_server):
    schema = httpx.get(f"{tiny_server.base_url}/schema/openapi.json").json()["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest", "ResponsesRequest"):
        assert schema[name]["additionalProperties"] is False


def test_allow_extra_fields_ignores_unknown_fields(start_fake):
    server = start_fake("--allow-extra-fields")
    body = {"model": "fake", "messages": MESSAGES, "max_tokens": 2, "verbosity": "low", "web_search_options": {}}
    assert post(server, CHAT, body).status_code == 200
    schema = httpx.get(f"{server.base_url}/schema/openapi.json").json()["components"]["schemas"]
    assert schema["ChatCompletionRequest"]["additionalProperties"] is True
