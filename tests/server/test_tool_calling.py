"""Tool calling through the official openai client, on the tiny random Llama, for the built-in
template (tools injected the Hermes way) and the three family templates: a forced call always
parses, the tool loop carries the result back to the model, streamed call deltas reassemble into
the non-streamed call, and the legacy ``functions`` API maps onto tools."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from chat_templates import FAMILIES
from conftest import TINY_NAME

from ortserve.server.tool_parsers import FORMATS, ToolCallExtractor

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather now", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Time now", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def api(tiny_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def template(family: str) -> dict | None:
    return {"chat_template": FAMILIES[family]} if FAMILIES[family] else None


def check_call(call) -> dict:
    assert call.type == "function" and call.id.startswith("call_")
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, SCHEMAS[call.function.name])
    return arguments


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_tool_loop_calls_gets_the_result_and_answers(api, tiny_server, family):
    messages = list(QUESTION)
    first = api.chat.completions.create(
        model=TINY_NAME, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=120, seed=1,
        parallel_tool_calls=False, extra_body=template(family),
    )  # fmt: skip
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        check_call(call)
    messages.append(choice.message.model_dump(exclude_none=True))
    for call in choice.message.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": f"result of {call.function.name}: 21"})
    answer = api.chat.completions.create(
        model=TINY_NAME, messages=messages, tools=TOOLS, tool_choice="auto", max_tokens=12, seed=1,
        extra_body=template(family),
    )  # fmt: skip
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.choices[0].message.content
    assert answer.usage.prompt_tokens > first.usage.prompt_tokens  # the call and its result are in the prompt
    if family == "builtin-chatml":  # the injected rendering, as the template sees it
        rendered = httpx.post(f"{tiny_server.base_url}/tokenize", json={"messages": messages}, timeout=30).json()
        text = httpx.post(f"{tiny_server.base_url}/detokenize", json={"tokens": rendered["tokens"]}).json()["prompt"]
        assert "<tool_response>\nresult of " in text and '<tool_call>\n{"name": "' in text


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_template_shows_the_tools_to_the_model_unless_tool_choice_is_none(api, family, tiny_llama_artifact):
    from ortserve.tokenizer import load_tokenizer

    def prompt_tokens(**fields) -> int:
        reply = api.chat.completions.create(
            model=TINY_NAME, messages=QUESTION, max_tokens=1, extra_body=template(family), **fields
        )
        return reply.usage.prompt_tokens

    listing = len(load_tokenizer(tiny_llama_artifact).encode(json.dumps(TOOLS)))
    plain = prompt_tokens()
    assert prompt_tokens(tools=TOOLS) - plain >= 0.8 * listing  # the definitions are in the prompt
    assert prompt_tokens(tools=TOOLS, tool_choice="none") == plain


@pytest.mark.parametrize("family", list(FAMILIES))
def test_streamed_call_deltas_reassemble_into_the_same_calls(api, family):
    kwargs = dict(model=TINY_NAME, messages=QUESTION, tools=TOOLS, tool_choice="required", max_tokens=150, seed=4)
    whole = api.chat.completions.create(**kwargs, extra_body=template(family)).choices[0].message
    calls: dict[int, dict] = {}
    finish = None
    for chunk in api.chat.completions.create(**kwargs, stream=True, extra_body=template(family)):
        delta = chunk.choices[0].delta
        for part in delta.tool_calls or []:
            entry = calls.setdefault(part.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = entry["id"] or part.id
            entry["name"] += part.function.name or ""
            entry["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish in ("tool_calls", "length")  # parallel calls may go on until max_tokens
    streamed = [(c["name"], c["arguments"]) for _, c in sorted(calls.items())]
    assert streamed and streamed == [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls.values())


def test_a_named_function_is_called_once_and_parallel_calls_can_be_turned_off(api):
    named = {"type": "function", "function": {"name": "get_time"}}
    for seed in range(3):
        reply = api.chat.completions.create(
            model=TINY_NAME, messages=QUESTION, tools=TOOLS, tool_choice=named, max_tokens=80, seed=seed
        )
        [call] = reply.choices[0].message.tool_calls
        assert call.function.name == "get_time" and check_call(call)["zone"] in ("UTC", "CET")
        single = api.chat.completions.create(
            model=TINY_NAME, messages=QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=False,
            max_tokens=120, seed=seed,
        )  # fmt: skip
        assert len(single.choices[0].message.tool_calls) == 1


def test_legacy_functions_map_onto_tools(api):
    functions = [t["function"] for t in TOOLS]
    reply = api.chat.completions.create(
        model=TINY_NAME, messages=QUESTION, functions=functions, function_call={"name": "get_weather"}, max_tokens=80
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert choice.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(choice.message.function_call.arguments), WEATHER)
    call = choice.message.function_call.model_dump()
    history = [
        *QUESTION,
        {"role": "assistant", "content": None, "function_call": call},
        {"role": "function", "name": "get_weather", "content": "sunny"},
    ]
    answer = api.chat.completions.create(model=TINY_NAME, messages=history, functions=functions, max_tokens=8)
    assert answer.choices[0].message.content


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": TOOLS, "functions": [TOOLS[0]["function"]]}, "functions"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ],
)
def test_tool_requests_that_cannot_be_served_are_a_400_naming_the_field(api, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(model=TINY_NAME, messages=QUESTION, max_tokens=8, extra_body=fields)
    assert info.value.body["param"] == param


def test_two_tools_of_one_name_are_served_and_a_forced_call_follows_one_of_them(api):
    """As vLLM and llama.cpp's server do, duplicate names are not refused (the OpenAPI schema
    cannot state uniqueness by a nested field): a call may follow either definition."""
    twins = [TOOLS[0], {"type": "function", "function": {"name": "get_weather", "parameters": TIME}}]
    for seed in range(4):
        response = api.chat.completions.create(
            model=TINY_NAME, messages=QUESTION, tools=twins, tool_choice="required", max_tokens=60, seed=seed,
            temperature=1.0, parallel_tool_calls=False,
        )  # fmt: skip
        (call,) = response.choices[0].message.tool_calls
        arguments = json.loads(call.function.arguments)
        assert call.function.name == "get_weather"
        jsonschema.validate(arguments, {"anyOf": [WEATHER, TIME]})


@pytest.mark.parametrize("name", list(FORMATS))
def test_each_parser_reads_its_family_and_leaves_other_text_as_content(name):
    texts = {
        "hermes": 'Sure. <tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "g", "arguments": {}}\n</tool_call>',
        "llama3_json": '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}',
        "mistral": 'Sure. [TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {}}]',
    }  # fmt: skip
    text = texts[name]
    for step in (1, 3, len(text)):  # however the text is split into deltas
        extractor = ToolCallExtractor(FORMATS[name])
        events = [e for i in range(0, len(text), step) for e in extractor.feed(text[i : i + step])] + extractor.finish()
        calls = [(e.name, json.loads(e.arguments)) for e in events if hasattr(e, "arguments")]
        assert calls == [("f", {"a": 1}), ("g", {})]
        assert "".join(e.text for e in events if hasattr(e, "text")).strip() in ("Sure.", "")
    broken = ToolCallExtractor(FORMATS[name])
    events = broken.feed("no call {here") + broken.finish()
    assert [e.text for e in events] == ["no call {here"]


def test_the_parser_comes_from_the_template_unless_the_flag_names_one():
    from chat_templates import HERMES, LLAMA3, MISTRAL

    from ortserve.server.protocol import ChatCompletionRequest
    from ortserve.server.tools import plan_tools

    body = ChatCompletionRequest.model_validate({"messages": QUESTION, "tools": TOOLS}, strict=False)
    for template, name in ((HERMES, "hermes"), (LLAMA3, "llama3_json"), (MISTRAL, "mistral"), (None, "hermes")):
        assert plan_tools(body, template, "auto").fmt.name == name
        assert plan_tools(body, template, "mistral").fmt.name == "mistral"
