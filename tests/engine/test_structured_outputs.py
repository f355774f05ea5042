"""Structured outputs in the engine, on the tiny random Llama: whatever the model prefers, every
sample matches its grammar (checked with ``jsonschema`` and ``re``), the grammar ends the sample
with finish reason "stop", and the grammar's state survives preemption and recompute."""

from __future__ import annotations

import json
import os
import re

import jsonschema
import pytest

from ortserve.artifact import load_manifest
from ortserve.sampling_params import InvalidParameter, SamplingParams, StructuredOutputs

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "member": {"type": "boolean"},
    },
    "required": ["name", "age", "tags", "member"],
    "additionalProperties": False,
}
PROMPTS = ["Describe a person as JSON:", "Hello", "1 2 3 4"]


def open_llm(artifact, **kwargs):
    from ortserve import LLM

    before = os.sched_getaffinity(0)
    try:
        return LLM(str(artifact), **kwargs)
    finally:
        os.sched_setaffinity(0, before)  # the module shares this thread with other tests


@pytest.fixture(scope="module")
def llm(tiny_llama_artifact):
    return open_llm(tiny_llama_artifact, kv_cache_space=0.05, max_num_seqs=16)


def constrained(spec: StructuredOutputs, seeds, temperatures, **kwargs) -> list[SamplingParams]:
    kwargs.setdefault("max_tokens", 256)
    return [
        SamplingParams(temperature=t, seed=s, structured_outputs=spec, **kwargs) for s in seeds for t in temperatures
    ]


def run(llm, params: list[SamplingParams]):
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(params))]
    return [c for out in llm.generate(prompts, params, use_tqdm=False) for c in out.outputs]


def test_every_sample_under_a_json_schema_validates(llm):
    samples = run(llm, constrained(StructuredOutputs(json=PERSON), range(8), [0.0, 0.7, 1.0, 1.5]))
    assert len(samples) == 32
    for c in samples:
        assert c.finish_reason == "stop", c
        jsonschema.validate(json.loads(c.text), PERSON)
    assert len({c.text for c in samples}) > 8  # sampling still varies within the grammar


def test_a_schema_given_as_text_and_any_json_object(llm):
    [c] = run(llm, constrained(StructuredOutputs(json=json.dumps(PERSON)), [1], [1.0]))
    jsonschema.validate(json.loads(c.text), PERSON)
    for c in run(llm, constrained(StructuredOutputs(json_object=True), range(4), [1.0], max_tokens=64)):
        if c.finish_reason == "stop":  # an open-ended object may run out of tokens first
            assert isinstance(json.loads(c.text), dict)
        else:
            assert c.finish_reason == "length" and c.text.startswith("{")


def test_an_integer_without_bounds_ends_within_16_digits(llm):
    """JSON bounds no integer, but a model that prefers digits must not write them until max_tokens:
    as in llama.cpp's grammars, an unbounded integer has at most 16 digits (a bound it states wins)."""
    tokenizer = llm.get_tokenizer()
    digits = {i: 100.0 for d in "123456789" for i in tokenizer.encode(d, add_special_tokens=False)}
    n = {"type": "integer"}
    free = {"type": "object", "properties": {"n": n}, "required": ["n"], "additionalProperties": False}
    wide = {**free, "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 10**20}}}
    for schema, least, most in ((free, 10**15, 10**16 - 1), (wide, 10**16, 10**20)):  # wide: past 16 digits
        [c] = run(llm, constrained(StructuredOutputs(json=schema), [0], [0.0], logit_bias=digits, max_tokens=64))
        assert c.finish_reason == "stop", c.text
        assert least <= abs(json.loads(c.text)["n"]) <= most, c.text


def test_every_regex_sample_matches(llm):
    pattern = r"[a-c]{2,5}-[0-9]{3}( ok)?"
    for c in run(llm, constrained(StructuredOutputs(regex=pattern), range(6), [0.0, 1.0, 2.0])):
        assert c.finish_reason == "stop" and re.fullmatch(pattern, c.text), c.text


def test_every_choice_sample_is_one_of_the_choices(llm):
    choices = ["yes", "no", "maybe so", "Paris, France"]
    texts = {c.text for c in run(llm, constrained(StructuredOutputs(choice=choices), range(8), [1.0, 3.0]))}
    assert texts <= set(choices) and len(texts) > 1


def test_lark_and_gbnf_grammars(llm):
    lark = 'start: "x=" NUMBER ("+" NUMBER){0,3}\nNUMBER: /[1-9][0-9]{0,2}/'
    gbnf = 'root ::= "(" item ("," item)* ")"\nitem ::= [a-z] [a-z]?'
    for grammar, pattern in (
        (lark, r"x=[1-9][0-9]{0,2}(\+[1-9][0-9]{0,2}){0,3}"),
        (gbnf, r"\([a-z]{1,2}(,[a-z]{1,2})*\)"),
    ):
        for c in run(llm, constrained(StructuredOutputs(grammar=grammar), range(4), [1.0], max_tokens=64)):
            if c.finish_reason == "stop":
                assert re.fullmatch(pattern, c.text), c.text
            else:  # gbnf's "*" may repeat until max_tokens; what is there is still a prefix
                assert c.finish_reason == "length" and grammar is gbnf


def test_n_samples_logprobs_and_ignore_eos_under_a_grammar(llm):
    params = SamplingParams(
        n=4, temperature=1.0, seed=3, max_tokens=256, logprobs=2, ignore_eos=True, min_tokens=2,
        structured_outputs=StructuredOutputs(json=PERSON),
    )  # fmt: skip
    [out] = llm.generate("Hello", params, use_tqdm=False)
    assert len({c.text for c in out.outputs}) > 1  # each sample has its own matcher
    for c in out.outputs:
        jsonschema.validate(json.loads(c.text), PERSON)
        assert c.finish_reason == "stop" and len(c.logprobs) == len(c.token_ids)


def test_a_grammar_survives_preemption(tiny_llama_artifact, llm):
    """A cache of 8 blocks for 8 sequences forces preemptions; each sample is recomputed from its
    tokens and its matcher state is kept, so the outputs equal those of an unpressed run."""
    params = constrained(StructuredOutputs(json=PERSON), range(8), [1.0], max_tokens=64)
    roomy = [c.text for c in run(llm, params)]
    eight_blocks = 8 * 16 * load_manifest(tiny_llama_artifact).kv_bytes_per_token("fp16") / 2**30  # the default rows
    tight = open_llm(tiny_llama_artifact, kv_cache_space=eight_blocks, max_num_seqs=8, block_size=16)
    texts = [c.text for c in run(tight, params)]
    assert tight.engine.core.scheduler.counters.num_preemptions > 0
    assert texts == roomy
    tight.engine.core.block_manager.check_idle()


def test_a_grammar_is_compiled_once_per_text(llm):
    cache = llm.engine.core.grammars._cache
    spec = StructuredOutputs(regex="[0-9]{4}")
    run(llm, constrained(spec, range(3), [1.0]))
    size = len(cache)
    run(llm, constrained(StructuredOutputs(regex="[0-9]{4}"), range(3), [1.0]))
    assert len(cache) == size and any("[0-9]{4}" in text for text in cache)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        (StructuredOutputs(json={"type": "foo"}), "Invalid type"),
        (StructuredOutputs(json="{not json"), "json is invalid"),
        (StructuredOutputs(regex="[a-"), "unclosed character class"),
        (StructuredOutputs(grammar="start: undefined_rule"), "unknown name"),
    ],
)
def test_a_grammar_llguidance_rejects_names_the_problem(llm, spec, problem):
    from ortserve.engine.grammar import check

    with pytest.raises(InvalidParameter, match=problem) as info:
        check(spec)  # what the server runs before sending
    assert info.value.param == "structured_outputs"
    with pytest.raises(InvalidParameter, match=problem):
        llm.generate("Hello", SamplingParams(structured_outputs=spec), use_tqdm=False)
    llm.engine.core.block_manager.check_idle()


def test_structured_outputs_needs_exactly_one_kind():
    with pytest.raises(InvalidParameter, match="exactly one"):
        StructuredOutputs(regex="a", choice=["a"])
    with pytest.raises(InvalidParameter, match="exactly one"):
        StructuredOutputs()
    with pytest.raises(InvalidParameter, match="at most 65536"):
        StructuredOutputs(regex="a" * 70_000)
