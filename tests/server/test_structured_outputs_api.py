"""Structured outputs through the official openai client, on the tiny random Llama: whatever a
random model prefers, the grammar makes every answer valid. ``chat.completions.parse()`` works for
the built-in chat template and the three tool-family templates; every JSON-schema answer over
many seeds and temperatures validates with ``jsonschema``; regex answers match; choice answers are
one of the choices; a schema llguidance rejects is a 400 naming the field and the problem."""

from __future__ import annotations

import json
import re
from typing import Annotated

import jsonschema
import openai
import pytest
from chat_templates import FAMILIES
from conftest import TINY_NAME
from pydantic import BaseModel, Field

QUESTION = [{"role": "user", "content": "Describe a city."}]
SEEDS_AND_TEMPERATURES = [(seed, t) for seed in range(6) for t in (0.0, 0.8, 1.5)]


class City(BaseModel):
    name: str = Field(max_length=20)
    population: int = Field(ge=0, le=50_000_000)
    capital: bool
    districts: list[Annotated[str, Field(max_length=12)]] = Field(max_length=3)  # bounded: a random model rambles


PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def api(tiny_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parse_returns_a_parsed_object_for_each_chat_template(api, family):
    template = FAMILIES[family]
    for seed in range(3):
        reply = api.chat.completions.parse(
            model=TINY_NAME,
            messages=QUESTION,
            response_format=City,
            max_tokens=200,
            temperature=1.0,
            seed=seed,
            extra_body={"chat_template": template} if template else None,
        )
        choice = reply.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, City), choice.message.content


def test_every_json_schema_answer_validates_over_seeds_and_temperatures(api):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}
    answers = []
    for seed, temperature in SEEDS_AND_TEMPERATURES:
        reply = api.chat.completions.create(
            model=TINY_NAME,
            messages=QUESTION,
            response_format=fmt,
            max_tokens=200,
            temperature=temperature,
            seed=seed,
            n=2,
        )
        for choice in reply.choices:
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.message.content), PERSON)
            answers.append(choice.message.content)
    assert len(set(answers)) > len(answers) // 4  # sampling still varies inside the grammar


def test_a_streamed_json_schema_answer_validates(api):
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    chunks = api.chat.completions.create(
        model=TINY_NAME, messages=QUESTION, response_format=fmt, max_tokens=200, seed=9, stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), PERSON)


def test_vllm_spellings_constrain_completions_and_chat(api):
    pattern = r"[A-Z]{2}-[0-9]{2,4}"
    choices = ["red", "green", "blue"]
    for seed, temperature in SEEDS_AND_TEMPERATURES[:9]:
        regex = api.completions.create(
            model=TINY_NAME, prompt="Code:", max_tokens=50, seed=seed, temperature=temperature,
            extra_body={"guided_regex": pattern},
        )  # fmt: skip
        assert re.fullmatch(pattern, regex.choices[0].text), regex.choices[0].text
        choice = api.chat.completions.create(
            model=TINY_NAME, messages=QUESTION, max_tokens=50, seed=seed, temperature=temperature,
            extra_body={"structured_outputs": {"choice": choices}},
        )  # fmt: skip
        assert choice.choices[0].message.content in choices
        person = api.completions.create(
            model=TINY_NAME, prompt="Person:", max_tokens=200, seed=seed, temperature=temperature,
            extra_body={"guided_json": PERSON},
        )  # fmt: skip
        jsonschema.validate(json.loads(person.choices[0].text), PERSON)


def test_json_object_answers_are_objects(api):
    for seed in range(4):
        reply = api.chat.completions.create(
            model=TINY_NAME, messages=QUESTION, response_format={"type": "json_object"}, max_tokens=64, seed=seed
        )
        choice = reply.choices[0]
        if choice.finish_reason == "stop":  # an open-ended object may be cut by max_tokens first
            assert isinstance(json.loads(choice.message.content), dict)
        else:
            assert choice.message.content.startswith("{")


@pytest.mark.parametrize(
    ("fields", "param", "problem"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
         "response_format", "Invalid type"),
        ({"guided_regex": "[a-"}, "guided_regex", "unclosed character class"),
        ({"structured_outputs": {"grammar": "start: nowhere"}}, "structured_outputs", "unknown name"),
        ({"guided_json": "{not json"}, "guided_json", "guided_json"),
        ({"guided_regex": "a", "guided_choice": ["a"]}, "guided_choice", "only one"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs", "exactly one"),
    ],
)  # fmt: skip
def test_a_grammar_that_cannot_be_used_is_a_400_naming_the_field(api, fields, param, problem):
    with pytest.raises(openai.BadRequestError) as info:
        api.chat.completions.create(model=TINY_NAME, messages=QUESTION, max_tokens=8, extra_body=fields)
    assert info.value.body["param"] == param
    assert problem in info.value.body["message"]
