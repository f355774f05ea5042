"""SamplingParams: defaults, normalisation, and errors that name the field and its range."""

from __future__ import annotations

import json
import pickle

import pytest

from ortserve.sampling_params import InvalidParameter, SamplingParams, model_sampling_defaults


def test_defaults_are_vllm_like():
    p = SamplingParams()
    assert (p.n, p.temperature, p.top_p, p.top_k, p.max_tokens, p.logprobs) == (1, 1.0, 1.0, 0, 16, None)
    assert not p.greedy and not p.needs_penalties


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("n", 0, "[1, 128]"),
        ("n", 129, "[1, 128]"),
        ("temperature", -0.1, "[0, 1e+06] (0 = greedy)"),
        ("temperature", float("nan"), "[0, 1e+06]"),
        ("temperature", float("inf"), "[0, 1e+06]"),
        ("top_p", 0.0, "(0, 1]"),
        ("top_p", 1.5, "(0, 1]"),
        ("top_k", -2, "0 or -1"),
        ("seed", 2**64, "[-9223372036854775808, 18446744073709551615]"),
        ("min_p", 1.5, "[0, 1]"),
        ("presence_penalty", 3.0, "[-2, 2]"),
        ("frequency_penalty", -2.5, "[-2, 2]"),
        ("repetition_penalty", 0.0, "(0, 2]"),
        ("max_tokens", 0, "[1, 2147483647]"),
        ("min_tokens", -1, "[0, 2147483647]"),
        ("logprobs", 21, "[0, 20]"),
        ("logit_bias", {5: 200.0}, "[-100, 100]"),
        ("logit_bias", {"²": 1.0}, "decimal digits"),
        ("logit_bias", {"--5": 1.0}, "decimal digits"),
        ("logit_bias", {i: 1.0 for i in range(1025)}, "at most 1024"),
        ("stop_token_ids", [-1], "[0, 2147483647]"),
        ("stop", ["x" * 257], "at most 256 characters"),
        ("stop", ["s"] * 17, "at most 16 are allowed"),
    ],
)
def test_bad_values_name_the_field_and_range(field, value, words):
    with pytest.raises(InvalidParameter) as info:
        SamplingParams(**{field: value})
    assert info.value.param == field
    assert str(info.value).startswith(field) and words in str(info.value)


def test_min_tokens_above_max_tokens_is_capped_by_max_tokens():
    assert SamplingParams(min_tokens=5, max_tokens=4).min_tokens == 4  # max_tokens always ends a choice
    assert SamplingParams(min_tokens=5, max_tokens=None).min_tokens == 5


def test_normalisation_of_stop_bias_and_top_k():
    p = SamplingParams(stop="###", logit_bias={"7": 1}, top_k=-1)
    assert p.stop == ["###"] and p.logit_bias == {7: 1.0} and p.top_k == 0
    assert SamplingParams(temperature=0).greedy and SamplingParams(top_k=1).greedy
    assert SamplingParams(max_tokens=None).max_tokens is None


def test_picklable():
    p = SamplingParams(n=2, stop=["x"], logit_bias={1: 2.0}, seed=3)
    assert pickle.loads(pickle.dumps(p)) == p


def test_the_model_s_generation_config_gives_defaults_within_bounds(tmp_path):
    config = {
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 20,
        "repetition_penalty": 1.05,
        "max_new_tokens": 512,
        "min_p": 2.0,  # out of bounds: left out
        "do_sample": True,  # not a default vLLM takes
        "eos_token_id": 2,
    }
    (tmp_path / "generation_config.json").write_text(json.dumps(config))
    defaults = model_sampling_defaults(tmp_path)
    assert defaults == {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "repetition_penalty": 1.05, "max_tokens": 512}
    assert SamplingParams(**defaults).max_tokens == 512
    (tmp_path / "generation_config.json").write_text('{"top_k": 2.5, "temperature": true, "top_p": "0.9"}')
    assert model_sampling_defaults(tmp_path) == {}
    (tmp_path / "generation_config.json").write_text("not json")
    assert model_sampling_defaults(tmp_path) == {} == model_sampling_defaults(tmp_path / "missing")
