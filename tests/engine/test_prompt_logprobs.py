"""Prompt logprobs equal transformers' log-softmax of the same prompt (within 1e-4), computed in the
same prefill: with prefix caching on (a cached prefix is recomputed, not skipped), with chunked
prefill in small chunks, and after a preemption."""

from __future__ import annotations

import os

import numpy as np
import pytest

from ortserve.sampling_params import SamplingParams

TOL = 1e-4
TOP = 3
PROMPT = (
    "The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. "
    "How vexingly quick daft zebras jump! Sphinx of black quartz, judge my vow. The five boxing "
    "wizards jump quickly; jackdaws love my big sphinx of quartz."
)


def open_llm(artifact, **kwargs):
    """An LLM with fp32 KV rows: transformers' logprobs within 1e-4 (the default fp16 rows move them by up
    to 6e-4; test_kv_cache_dtype.py bounds that rounding on its own)."""
    from ortserve import LLM

    before = os.sched_getaffinity(0)
    try:
        return LLM(str(artifact), kv_cache_dtype="fp32", **kwargs)
    finally:
        os.sched_setaffinity(0, before)


@pytest.fixture(scope="module")
def reference(tiny_llama_logprobs):
    return tiny_llama_logprobs


@pytest.fixture(scope="module")
def prompt_ids(tiny_llama_checkpoint):
    from ortserve.tokenizer import load_tokenizer

    ids = load_tokenizer(tiny_llama_checkpoint).encode(PROMPT + " " + PROMPT.upper())
    assert len(ids) > 64  # several blocks and several chunks
    return ids


def check_against_reference(out, prompt_ids, reference) -> None:
    expected = reference(prompt_ids)
    got = out.prompt_logprobs
    assert got is not None and len(got) == len(prompt_ids) and got[0] is None
    for j, entry in enumerate(got[1:]):
        row, token = expected[j], prompt_ids[j + 1]
        assert abs(entry.logprob - row[token]) < TOL, (j, entry.logprob, row[token])
        assert (
            entry.rank == int((row > row[token] + TOL).sum()) + 1
            or abs(np.sort(row)[::-1][entry.rank - 1] - row[token]) < TOL
        )
        top_ids = [t for t, _ in entry.top_logprobs]
        assert len(top_ids) == TOP
        np.testing.assert_allclose([lp for _, lp in entry.top_logprobs], np.sort(row)[::-1][:TOP], atol=TOL)
        assert np.all(row[top_ids] >= np.sort(row)[::-1][TOP - 1] - TOL)


def asking(**kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=TOP, **kwargs)


def test_prompt_logprobs_match_transformers_with_prefix_caching_on(tiny_llama_artifact, prompt_ids, reference):
    llm = open_llm(tiny_llama_artifact, kv_cache_space=0.01, enable_prefix_caching=True)
    llm.generate(prompt_ids, SamplingParams(max_tokens=2), use_tqdm=False)  # fills the prefix cache
    [again] = llm.generate(prompt_ids, SamplingParams(max_tokens=2), use_tqdm=False)
    assert again.num_cached_tokens >= 32  # the prefix is in the cache
    [out] = llm.generate(prompt_ids, asking(), use_tqdm=False)
    assert out.num_cached_tokens == 0  # recomputed, since the cache has no logits
    check_against_reference(out, prompt_ids, reference)
    [plain] = llm.generate(prompt_ids, SamplingParams(temperature=0.0, max_tokens=4), use_tqdm=False)
    assert out.outputs[0].token_ids == plain.outputs[0].token_ids  # generation is unchanged
    llm.engine.core.block_manager.check_idle()


def test_prompt_logprobs_match_transformers_with_chunked_prefill(tiny_llama_artifact, prompt_ids, reference):
    llm = open_llm(tiny_llama_artifact, kv_cache_space=0.01, max_num_batched_tokens=7)
    outs = llm.generate([prompt_ids, prompt_ids[:20]], [asking(n=2), asking()], use_tqdm=False)
    check_against_reference(outs[0], prompt_ids, reference)
    check_against_reference(outs[1], prompt_ids[:20], reference)
    assert len(outs[0].outputs) == 2


def test_prompt_logprobs_survive_a_preemption(tiny_llama_artifact, prompt_ids, reference):
    """Four long prompts in a cache that holds about two: some are preempted mid-prefill or after
    it, recomputed, and still report each prompt token once."""
    llm = open_llm(tiny_llama_artifact, kv_cache_space=12 * 16 * 1024 / 2**30, max_num_batched_tokens=16)
    prompts = [prompt_ids[:60], prompt_ids[1:61], prompt_ids[2:62], prompt_ids[3:63]]
    outs = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=40, prompt_logprobs=TOP), use_tqdm=False)
    assert llm.engine.core.scheduler.counters.num_preemptions > 0
    for out, prompt in zip(outs, prompts):
        check_against_reference(out, prompt, reference)


def test_a_one_token_prompt_has_only_the_empty_first_entry(tiny_llama_artifact):
    llm = open_llm(tiny_llama_artifact, kv_cache_space=0.01)
    [out] = llm.generate([5], asking(), use_tqdm=False)
    assert out.prompt_logprobs == [None]
