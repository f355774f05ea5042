"""The Responses API through the official openai client, on the tiny random Llama: create and
stream (typed events, the final response equal to the streamed text), text.format for structured
output, function tools with a function_call_output round trip, and a 400 naming what a stateless
server cannot do."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from conftest import TINY_NAME

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather now",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture(scope="module")
def api(tiny_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_create_answers_with_a_message_and_usage(api):
    response = api.responses.create(
        model=TINY_NAME, input="Say hello.", instructions="Be brief.", max_output_tokens=12, temperature=0
    )
    assert response.object == "response" and response.id.startswith("resp")
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text and response.output_text == message.content[0].text
    assert response.usage.output_tokens == 12 and response.usage.total_tokens == response.usage.input_tokens + 12
    again = api.responses.create(model=TINY_NAME, input="Say hello.", instructions="Be brief.", max_output_tokens=12)
    assert again.usage.input_tokens == response.usage.input_tokens  # instructions and input as one prompt


def test_stream_sends_typed_events_that_add_up_to_the_final_response(api):
    kwargs = dict(
        model=TINY_NAME, input=[{"role": "user", "content": "Tell a story."}], max_output_tokens=16, temperature=0
    )
    with api.responses.stream(**kwargs) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == api.responses.create(**kwargs).output_text  # greedy: the same text


def test_text_format_json_schema_is_enforced_and_parsed(api):
    for _ in range(3):
        response = api.responses.create(
            model=TINY_NAME, input="A person:", max_output_tokens=100, temperature=1.0,
            text={"format": {"type": "json_schema", "name": "person", "schema": PERSON, "strict": True}},
        )  # fmt: skip
        assert response.status == "completed"
        jsonschema.validate(json.loads(response.output_text), PERSON)


def test_function_tools_round_trip_through_function_call_output(api):
    response = api.responses.create(
        model=TINY_NAME, input="Weather in Paris?", tools=[WEATHER_TOOL], tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=80,
    )  # fmt: skip
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] is not None
    follow_up = api.responses.create(
        model=TINY_NAME,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
        tools=[WEATHER_TOOL],
        max_output_tokens=8,
    )
    assert follow_up.output_text
    assert follow_up.usage.input_tokens > response.usage.input_tokens  # the call and its output are in the prompt


def test_streamed_function_calls_have_their_argument_events(api):
    with api.responses.stream(
        model=TINY_NAME, input="Weather?", tools=[WEATHER_TOOL], tool_choice="required", parallel_tool_calls=False,
        max_output_tokens=80,
    ) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and "response.function_call_arguments.done" in kinds
    [call] = [item for item in final.output if item.type == "function_call"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == call.arguments and json.loads(call.arguments)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "foo"}}}}, "text"),
    ],
)
def test_what_a_stateless_server_cannot_do_is_a_400_naming_it(api, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        api.responses.create(model=TINY_NAME, input="hi", max_output_tokens=4, extra_body=fields)
    assert info.value.body["param"] == param


def test_include_logprobs_gives_the_output_texts_tokens_as_chat_completions_does(api):
    """The Responses API's logprobs (include message.output_text.logprobs, top_logprobs) are the chat
    endpoint's for the same greedy request, whole and, streamed, delta by delta."""
    asked = dict(temperature=0, max_output_tokens=8, include=["message.output_text.logprobs"], top_logprobs=3)
    response = api.responses.create(model=TINY_NAME, input="hello", **asked)
    [message] = [item for item in response.output if item.type == "message"]
    tokens = [(lp.token, lp.logprob, [t.token for t in lp.top_logprobs]) for lp in message.content[0].logprobs]
    chat = api.chat.completions.create(
        model=TINY_NAME,
        messages=[{"role": "user", "content": "hello"}],
        temperature=0,
        max_tokens=8,
        logprobs=True,
        top_logprobs=3,
    )
    expected = [(lp.token, lp.logprob, [t.token for t in lp.top_logprobs]) for lp in chat.choices[0].logprobs.content]
    assert len(tokens) == response.usage.output_tokens == 8
    assert [(t, alts) for t, _, alts in tokens] == [(t, alts) for t, _, alts in expected]
    assert [lp for _, lp, _ in tokens] == pytest.approx([lp for _, lp, _ in expected], abs=1e-5)
    events = list(api.responses.create(model=TINY_NAME, input="hello", stream=True, **asked))
    streamed = [lp.token for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert streamed == [t for t, _, _ in tokens]
    done = next(e for e in events if e.type == "response.output_text.done")
    assert [lp.token for lp in done.logprobs] == streamed
    with pytest.raises(openai.BadRequestError) as info:
        api.responses.create(model=TINY_NAME, input="hi", max_output_tokens=2, top_logprobs=2)
    assert info.value.body["param"] == "top_logprobs"


def test_an_invalid_text_format_is_named_as_the_responses_api_names_it(api):
    bad = {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "foo"}}}}
    with pytest.raises(openai.BadRequestError) as info:
        api.responses.create(model=TINY_NAME, input="hi", max_output_tokens=4, extra_body=bad)
    message = info.value.body["message"]
    assert message.startswith("Invalid 'text': text.format.json is invalid") and "response_format" not in message
