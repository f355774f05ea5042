"""Prompt logprobs over HTTP equal transformers' log-softmax (within 1e-4): /v1/completions with
``echo`` and ``logprobs`` (what lm-eval's loglikelihood tasks send), vLLM's ``prompt_logprobs`` on
both endpoints, a prompt longer than one prefill chunk, and a prompt whose prefix is cached. The
server keeps fp32 KV rows (the default fp16 rows move logprobs by up to 6e-4: tests/engine/test_kv_cache_dtype.py
bounds that rounding on its own)."""

from __future__ import annotations

import httpx
import numpy as np
import openai
import pytest
from conftest import TINY_NAME, serve_tiny

from ortserve.tokenizer import load_tokenizer

TOL = 1e-4
TEXT = "The quick brown fox jumps over the lazy dog, and then it rests in the warm afternoon sun."


@pytest.fixture(scope="module")
def exact_server(tiny_llama_artifact):
    yield from serve_tiny(tiny_llama_artifact, "--trust-request-chat-template", "--kv-cache-dtype", "fp32")


@pytest.fixture(scope="module")
def api(exact_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{exact_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_artifact):
    return load_tokenizer(tiny_llama_artifact)


def test_echo_with_logprobs_returns_the_prompts_logprobs(api, tokenizer, tiny_llama_logprobs):
    long_prompt = " ".join([TEXT] * 16)  # over 256 tokens: more than one prefill chunk
    prompts = [TEXT, long_prompt]
    reply = api.completions.create(model=TINY_NAME, prompt=prompts, echo=True, logprobs=3, max_tokens=1, temperature=0)
    for prompt, choice in zip(prompts, reply.choices):
        ids = tokenizer.encode(prompt)
        expected = tiny_llama_logprobs(ids)
        lp = choice.logprobs
        assert choice.text.startswith(prompt)
        assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
        assert len(lp.tokens) == len(ids) + 1  # the prompt, then the generated token
        got = np.array(lp.token_logprobs[1 : len(ids)])
        np.testing.assert_allclose(got, expected[np.arange(len(ids) - 1), ids[1:]], atol=TOL)
        for j in range(1, len(ids)):
            top = sorted(lp.top_logprobs[j].values(), reverse=True)[:3]
            np.testing.assert_allclose(top, np.sort(expected[j - 1])[::-1][:3], atol=TOL)
        assert lp.text_offset[: len(ids)] == sorted(lp.text_offset[: len(ids)])
    assert len(tokenizer.encode(long_prompt)) > 256


def test_vllm_prompt_logprobs_on_completions_skips_the_prefix_cache(api, tokenizer, tiny_llama_logprobs):
    ids = tokenizer.encode(TEXT)
    api.completions.create(model=TINY_NAME, prompt=ids, max_tokens=1)  # the prefix is now cached
    cached = api.completions.create(model=TINY_NAME, prompt=ids, max_tokens=1)
    assert cached.usage.prompt_tokens_details.cached_tokens > 0
    reply = api.completions.create(model=TINY_NAME, prompt=ids, max_tokens=1, extra_body={"prompt_logprobs": 2})
    assert reply.usage.prompt_tokens_details.cached_tokens == 0  # recomputed for its logits
    rows = reply.choices[0].model_extra["prompt_logprobs"]
    expected = tiny_llama_logprobs(ids)
    assert rows[0] is None and len(rows) == len(ids)
    for j, row in enumerate(rows[1:], start=1):
        entry = row[str(ids[j])]
        assert abs(entry["logprob"] - expected[j - 1, ids[j]]) < TOL
        assert entry["decoded_token"] == tokenizer.decode([ids[j]])
        value = expected[j - 1, ids[j]]  # rank 1 = most likely, within the tolerance's ties
        assert (expected[j - 1] > value + TOL).sum() + 1 <= entry["rank"] <= (expected[j - 1] > value - TOL).sum() + 1
        assert len(row) in (2, 3)  # the top 2, and the prompt token when it is not among them


def test_chat_prompt_logprobs_cover_the_rendered_prompt(api, tokenizer, tiny_llama_logprobs, exact_server):
    messages = [{"role": "user", "content": TEXT}]
    reply = api.chat.completions.create(
        model=TINY_NAME, messages=messages, max_tokens=2, extra_body={"prompt_logprobs": 0}
    )
    rows = reply.model_extra["prompt_logprobs"]
    ids = httpx.post(f"{exact_server.base_url}/tokenize", json={"messages": messages}).json()["tokens"]
    assert len(rows) == len(ids) == reply.usage.prompt_tokens
    expected = tiny_llama_logprobs(ids)
    got = [row[str(token)]["logprob"] for row, token in zip(rows[1:], ids[1:])]
    np.testing.assert_allclose(got, expected[np.arange(len(ids) - 1), ids[1:]], atol=TOL)


def test_a_streamed_echo_carries_the_prompt_logprobs_first(api, tokenizer, tiny_llama_logprobs):
    ids = tokenizer.encode(TEXT)
    chunks = list(
        api.completions.create(model=TINY_NAME, prompt=TEXT, echo=True, logprobs=1, max_tokens=3, stream=True)
    )
    first = chunks[0].choices[0]
    assert first.text.startswith(TEXT) and first.logprobs.token_logprobs[0] is None
    expected = tiny_llama_logprobs(ids)
    np.testing.assert_allclose(
        first.logprobs.token_logprobs[1 : len(ids)], expected[np.arange(len(ids) - 1), ids[1:]], atol=TOL
    )
    tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
    assert len(tokens) == len(ids) + 3
