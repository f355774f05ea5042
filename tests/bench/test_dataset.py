"""Benchmark prompts have exactly the requested token lengths (SmolLM2's real tokenizer)."""

from __future__ import annotations

import pytest

from ortserve.bench.dataset import PromptMaker, bench_tokenizer, random_requests, shared_prefix_requests


@pytest.fixture(scope="module")
def tokenizer(smollm2_checkpoint):
    return bench_tokenizer(smollm2_checkpoint)


@pytest.fixture(scope="module")
def maker(tokenizer):
    return PromptMaker(tokenizer)


def n_tokens(tokenizer, text: str) -> int:
    return tokenizer.count(text)


def test_a_whole_word_vocabulary_is_found(maker):
    assert len(maker.words) > 10_000


@pytest.mark.parametrize("length", [1, 128, 512])
def test_random_prompts_have_exact_lengths(tokenizer, maker, length):
    reqs = random_requests(maker, num=8, input_len=length, output_len=16, seed=1)
    assert [r.prompt_len for r in reqs] == [length] * 8
    assert [n_tokens(tokenizer, r.prompt) for r in reqs] == [length] * 8
    assert len({r.prompt for r in reqs}) == 8


def test_same_seed_same_prompts(maker):
    assert random_requests(maker, 3, 32, 8, seed=4) == random_requests(maker, 3, 32, 8, seed=4)


def test_shared_prefix_prompts_share_their_prefix_tokens(tokenizer, maker):
    reqs = shared_prefix_requests(maker, num=6, input_len=128, output_len=8, prefix_len=96, num_prefixes=2, seed=0)
    ids = tokenizer.encode_batch([r.prompt for r in reqs])
    assert [len(i) for i in ids] == [128] * 6
    assert ids[0][:96] == ids[2][:96] == ids[4][:96]
    assert ids[1][:96] == ids[3][:96] == ids[5][:96]
    assert ids[0][:96] != ids[1][:96]
    assert ids[0][96:] != ids[2][96:]


def test_prefix_longer_than_the_prompt_is_an_error(maker):
    with pytest.raises(SystemExit, match="--prefix-len"):
        shared_prefix_requests(maker, 1, input_len=10, output_len=1, prefix_len=20, num_prefixes=1, seed=0)


def test_grounded_prompts_hold_a_passage_of_about_the_length_in_a_chat_turn(tokenizer):
    from ortserve.bench.dataset import PASSAGE_SENTENCES, grounded_requests

    requests = grounded_requests(tokenizer, 4, 96, 128, seed=0)
    assert len({r.prompt for r in requests}) == 4
    for r in requests:
        assert r.prompt.startswith("<|im_start|>") and r.prompt.rstrip().endswith("<|im_start|>assistant")
        assert sum(s[:30] in r.prompt for s in PASSAGE_SENTENCES) >= 3  # plain sentences to copy
        assert 96 <= r.prompt_len <= 96 + 80 and r.prompt_len == tokenizer.count(r.prompt)
    assert "teh " in requests[1].prompt and "teh " not in requests[0].prompt  # the correction task
