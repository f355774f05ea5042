"""One validation layer: the offline API and the HTTP server accept and reject exactly the same
inputs, and a rejection names the same parameter. Each case runs through both, on the same tiny
artifact with the same max_model_len."""

from __future__ import annotations

import httpx
import pytest
from server_process import ServerProcess

from ortserve.sampling_params import InvalidParameter, SamplingParams

MAX_MODEL_LEN = 64
VOCAB = 49152
PROMPT = [5, 6, 7, 8]

# (case, request fields, the parameter a rejection names; None = accepted by both)
CASES = [
    ("temperature < 0", {"temperature": -1.0}, "temperature"),
    ("top_p = 0", {"top_p": 0.0}, "top_p"),
    ("top_p > 1", {"top_p": 1.5}, "top_p"),
    ("top_k < -1", {"top_k": -2}, "top_k"),
    ("min_p > 1", {"min_p": 2.0}, "min_p"),
    ("presence_penalty > 2", {"presence_penalty": 3.0}, "presence_penalty"),
    ("frequency_penalty < -2", {"frequency_penalty": -3.0}, "frequency_penalty"),
    ("repetition_penalty = 0", {"repetition_penalty": 0.0}, "repetition_penalty"),
    ("repetition_penalty > 2", {"repetition_penalty": 2.5}, "repetition_penalty"),  # the layers disagreed
    ("n = 0", {"n": 0}, "n"),
    ("n > 128", {"n": 129}, "n"),
    ("max_tokens = 0", {"max_tokens": 0}, "max_tokens"),
    ("min_tokens < 0", {"min_tokens": -1}, "min_tokens"),
    ("logit_bias key '²'", {"logit_bias": {"²": 1.0}}, "logit_bias"),
    ("logit_bias value > 100", {"logit_bias": {"5": 200.0}}, "logit_bias"),
    ("logit_bias key outside the vocabulary", {"logit_bias": {str(VOCAB): 1.0}}, "logit_bias"),
    ("a stop string too long", {"stop": ["x" * 300]}, "stop"),
    ("too many stop strings", {"stop": ["a"] * 17}, "stop"),
    ("stop token outside the vocabulary", {"stop_token_ids": [VOCAB]}, "stop_token_ids"),
    ("seed above uint64", {"seed": 2**64}, "seed"),
    ("logprobs > 20", {"logprobs": 21}, "logprobs"),
    ("prompt_logprobs > 20", {"prompt_logprobs": 21}, "prompt_logprobs"),
    ("truncate_prompt_tokens = 0", {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("a choice list too long", {"structured_outputs": {"choice": ["a"] * 1025}}, "structured_outputs"),
    ("a grammar too long", {"structured_outputs": {"grammar": "x" * 70_000}}, "structured_outputs"),
    ("two kinds of structured output", {"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ("truncate_prompt_tokens = 2", {"truncate_prompt_tokens": 2}, None),
    ("prompt of max_model_len tokens", {"prompt": [5] * MAX_MODEL_LEN}, "prompt"),  # the layers disagreed
    ("max_tokens beyond the room", {"prompt": [5] * 60, "max_tokens": 5}, None),  # ends at the context
    ("prompt token outside the vocabulary", {"prompt": [5, VOCAB]}, "prompt"),
    ("repetition_penalty = 2", {"repetition_penalty": 2.0}, None),
    ("a tiny temperature with logit_bias", {"temperature": 1e-300, "logit_bias": {"5": 100.0}}, None),
    ("a negative seed", {"seed": -5, "temperature": 1.0}, None),
    ("top_k = -1", {"top_k": -1}, None),
    ("prompt of max_model_len - 1 tokens", {"prompt": [5] * (MAX_MODEL_LEN - 1), "max_tokens": 1}, None),
]


@pytest.fixture(scope="module")
def offline(tiny_llama_artifact):
    from ortserve import LLM

    return LLM(str(tiny_llama_artifact), max_model_len=MAX_MODEL_LEN, kv_cache_space=0.05, threads_bind="nobind")


@pytest.fixture(scope="module")
def http(tiny_llama_artifact):
    proc = ServerProcess.real(
        tiny_llama_artifact,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-space",
        "0.05",
        "--threads-bind",
        "nobind",
        "--served-model-name",
        "tiny",
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def run_offline(llm, fields: dict) -> str | None:
    fields = dict(fields)
    prompt = fields.pop("prompt", PROMPT)
    fields.setdefault("max_tokens", 2)
    try:
        llm.generate([prompt], SamplingParams(**fields), use_tqdm=False)
    except InvalidParameter as exc:
        return exc.param
    return None


def run_http(proc: ServerProcess, fields: dict) -> str | None:
    body = {"model": "tiny", "prompt": PROMPT, "max_tokens": 2, **fields}
    response = httpx.post(f"{proc.base_url}/v1/completions", json=body, timeout=60)
    if response.status_code == 200:
        return None
    assert response.status_code == 400, response.text
    return response.json()["error"]["param"]


@pytest.mark.slow
@pytest.mark.parametrize("fields, param", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_offline_and_http_accept_and_reject_the_same_inputs(offline, http, fields, param):
    assert run_offline(offline, fields) == param
    assert run_http(http, fields) == param
    assert not offline.engine.has_unfinished_requests()


def test_the_case_table_covers_every_bound():
    from ortserve.sampling_params import BOUNDS

    # token ids, bias values, choices and grammar texts are bounds inside a named parameter
    named = {param for _, _, param in CASES if param} | {"token_id", "logit_bias_value", "choice", "grammar"}
    assert set(BOUNDS) <= named, set(BOUNDS) - named


@pytest.mark.slow
def test_max_tokens_beyond_the_room_ends_at_the_context_in_both(offline, http):
    """As llama.cpp's server does: the choice gets the room there is and ends with "length"."""
    fields = {"prompt": [5] * (MAX_MODEL_LEN - 4), "max_tokens": 50, "ignore_eos": True}
    (result,) = offline.generate([fields["prompt"]], SamplingParams(max_tokens=50, ignore_eos=True), use_tqdm=False)
    assert len(result.outputs[0].token_ids) == 4 and result.outputs[0].finish_reason == "length"
    body = httpx.post(f"{http.base_url}/v1/completions", json={"model": "tiny", **fields}, timeout=60).json()
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["finish_reason"] == "length"
