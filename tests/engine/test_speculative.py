"""The n-gram proposer: drafts are what followed the longest (then most recent) earlier match of a
sequence's tail, checked against a direct search."""

from __future__ import annotations

import numpy as np
from engine_fakes import check_drafted_run, copying_model, make_request, run_one_drafted, verify_with
from hypothesis import given, settings
from hypothesis import strategies as st

from ortserve.engine.block_manager import BlockManager
from ortserve.engine.scheduler import Scheduler
from ortserve.engine.speculative import NgramProposer


def reference_propose(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The definition, by brute force: for n from max_n down, the latest earlier i whose n tokens
    equal the tail; the draft is what follows."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = tokens[length - n :]
        for start in range(length - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                return tokens[start + n : start + n + k]
    return []


def propose(tokens: list[int], k: int = 4, min_n: int = 1, max_n: int = 4) -> list[int]:
    return NgramProposer(k, min_n, max_n).propose(np.array(tokens, np.int64), k)


def test_a_repeated_phrase_is_continued_from_its_earlier_occurrence():
    text = [5, 6, 7, 8, 9, 10, 1, 2, 5, 6, 7]
    assert propose(text) == [8, 9, 10, 1]


def test_the_longest_match_wins_over_a_more_recent_shorter_one():
    # tail (3, 4): "3 4" once, then a lone "4" more recently; the two-token match decides
    tokens = [3, 4, 100, 101, 9, 4, 200, 3, 4]
    assert propose(tokens, k=2) == [100, 101]


def test_nothing_is_proposed_without_a_match_or_below_min_n():
    assert propose([1, 2, 3, 4]) == []
    assert propose([1, 2, 9, 2], min_n=2) == []
    assert propose([1, 2, 9, 2], min_n=1) == [9, 2]


def test_the_limit_caps_the_draft():
    tokens = [1, 2, 3, 4, 5, 1, 2]
    assert NgramProposer(4).propose(np.array(tokens, np.int64), limit=2) == [3, 4]
    assert NgramProposer(4).propose(np.array(tokens, np.int64), limit=0) == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(0, 5), min_size=1, max_size=60),
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(1, 5),
)
def test_matches_the_brute_force_definition(tokens, k, min_n, extra):
    max_n = min_n + extra - 1
    assert propose(tokens, k, min_n, max_n) == reference_propose(tokens, k, min_n, max_n)


# --- the scheduler with drafts, on a fake model that copies (so drafts are often right) ---------


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    block_size=st.sampled_from([1, 4, 16]),
    num_blocks=st.integers(6, 40),
    budget=st.integers(1, 40),
    k=st.integers(1, 6),
    prefix_caching=st.booleans(),
)
def test_drafted_schedules_match_solo_runs_and_leak_nothing(data, block_size, num_blocks, budget, k, prefix_caching):
    max_model_len = num_blocks * block_size
    scheduler = Scheduler(BlockManager(num_blocks, block_size, prefix_caching), 4, budget, NgramProposer(k, 1, 3))
    check_drafted_run(data.draw, scheduler, max_model_len)


def test_drafts_are_proposed_and_mostly_kept_on_a_copying_model():
    scheduler = Scheduler(BlockManager(64, 4), 4, 64, NgramProposer(4, 1, 3))
    steps = run_one_drafted(scheduler, [3, 4, 5, 6, 3, 4, 5, 6], 40)
    c = scheduler.counters
    assert 0 < c.num_accepted_tokens < c.num_draft_tokens
    assert steps < 40  # several tokens a step: fewer steps than tokens
    scheduler.block_manager.check_idle()


def test_requests_with_penalties_get_no_drafts_and_min_tokens_do():
    scheduler = Scheduler(BlockManager(64, 4), 4, 64, NgramProposer(4, 1, 3))
    penalised = make_request([3, 4, 3, 4, 3, 4], max_tokens=10, repetition_penalty=1.2)
    pinned = make_request([3, 4, 3, 4, 3, 4], max_tokens=10, min_tokens=10)
    for r in (penalised, pinned):
        scheduler.add(r)
    drafted_early = []
    while scheduler.has_unfinished_requests():
        batch = scheduler.schedule()
        drafted_early += [s.num_draft_tokens for s in batch.sampling if s.request is pinned]
        assert all(s.num_draft_tokens == 0 for s in batch.sampling if s.request is penalised)
        scheduler.update(batch, [verify_with(copying_model, s) for s in batch.sampling], None)
    assert any(drafted_early)  # min_tokens is applied row by row in verify: drafts are fine


# --- Sampler.verify: exact for greedy, the target's distribution for random sampling ------------


def drafted_sequence(temperature: float, drafts: list[int], seed: int = 0, **params):
    request = make_request([1, 2, 3], temperature=temperature, max_tokens=16, **params)
    seq = request.sequences[0]
    seq.rng = np.random.default_rng(seed)
    seq.add_drafts(drafts)
    return seq


def test_greedy_verification_keeps_drafts_while_they_are_the_argmax():
    from ortserve.engine.sampler import Sampler

    logits = np.full((4, 8), -5.0, np.float32)
    logits[0, 4] = logits[1, 6] = logits[2, 1] = logits[3, 7] = 5.0  # the target's choices
    for drafts, expected in (([4, 6, 1], [4, 6, 1, 7]), ([4, 5, 1], [4, 6]), ([0, 6, 1], [4])):
        seq = drafted_sequence(0.0, drafts)
        tokens, logprobs = Sampler().verify(logits.copy(), [seq], [drafts])
        assert tokens == [expected] and logprobs is None


def test_random_verification_draws_from_the_target_distribution():
    """The first emitted token is distributed as p(row 0) and, when the draft was kept, the next
    as p(row 1): rejection sampling's guarantee, checked over 20,000 draws."""
    from ortserve.engine.sampler import Sampler

    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 1.0, (2, 6)).astype(np.float32)
    p = np.exp(logits / 0.8) / np.exp(logits / 0.8).sum(axis=1, keepdims=True)
    draft = int(np.argsort(p[0])[-2])  # a likely but not the likeliest token
    first, second = np.zeros(6), np.zeros(6)
    sampler = Sampler()
    for i in range(20_000):
        seq = drafted_sequence(0.8, [draft], seed=i)
        [tokens], _ = sampler.verify(logits.copy(), [seq], [[draft]])
        first[tokens[0]] += 1
        if tokens[0] == draft:
            second[tokens[1]] += 1
    for counts, expected in ((first, p[0]), (second, p[1])):
        freq = counts / counts.sum()
        sigma = np.sqrt(expected * (1 - expected) / counts.sum())
        assert np.all(np.abs(freq - expected) < 5 * sigma + 1e-3), (freq, expected)


def test_min_tokens_masks_end_of_sequence_in_the_draft_rows_before_it():
    """EOS is every row's favourite; with min_tokens 2 the first two rows (output tokens 0 and 1)
    may not take it, the third may: the drafts are kept up to there, then EOS."""
    from ortserve.engine.sampler import Sampler

    eos = 2  # engine_fakes' EOS
    logits = np.zeros((4, 8), np.float32)
    logits[:, eos] = 9.0
    logits[0, 4] = logits[1, 6] = logits[2, 1] = logits[3, 7] = 5.0  # the next best
    seq = drafted_sequence(0.0, [4, 6, 1], min_tokens=2)
    tokens, _ = Sampler().verify(logits.copy(), [seq], [[4, 6, 1]])
    assert tokens == [[4, 6, eos]]
    seq = drafted_sequence(0.0, [4, 6, 1], min_tokens=4)
    tokens, _ = Sampler().verify(logits.copy(), [seq], [[4, 6, 1]])
    assert tokens == [[4, 6, 1, 7]]


def test_drafts_drawn_from_q_keep_the_target_distribution_and_are_kept_min_p_q_of_the_time():
    """A draft model's draft x ~ q is kept with probability min(1, p(x)/q(x)) and replaced from
    max(p - q, 0): the first token is distributed as p(row 0), the next (when the draft was kept) as
    p(row 1), and a draft is kept sum_x min(p(x), q(x)) of the time, more than p(argmax q) would be."""
    from ortserve.engine.sampler import Sampler

    rng = np.random.default_rng(1)
    logits = rng.normal(0.0, 1.0, (2, 6)).astype(np.float32)
    p = np.exp(logits / 0.8) / np.exp(logits / 0.8).sum(axis=1, keepdims=True)
    q_logits = logits[0] + rng.normal(0.0, 0.7, 6)  # a draft model that mostly agrees
    q = (np.exp(q_logits) / np.exp(q_logits).sum()).astype(np.float32)
    first, second, kept = np.zeros(6), np.zeros(6), 0
    sampler = Sampler()
    trials = 20_000
    for i in range(trials):
        draft = int(rng.choice(6, p=q / q.sum()))
        seq = drafted_sequence(0.8, [draft], seed=i)
        seq.draft_probs = q[None, :]
        [tokens], _ = sampler.verify(logits.copy(), [seq], [[draft]])
        first[tokens[0]] += 1
        if len(tokens) == 2:
            kept += 1
            second[tokens[1]] += 1
    for counts, expected in ((first, p[0]), (second, p[1])):
        freq = counts / counts.sum()
        sigma = np.sqrt(expected * (1 - expected) / counts.sum())
        assert np.all(np.abs(freq - expected) < 5 * sigma + 1e-3), (freq, expected)
    overlap = np.minimum(p[0], q).sum()
    assert abs(kept / trials - overlap) < 5 * np.sqrt(overlap * (1 - overlap) / trials)
    assert overlap > p[0][int(np.argmax(q))]  # what a greedy draft would be kept


def test_logit_bias_applies_to_every_draft_row():
    from ortserve.engine.sampler import Sampler

    logits = np.zeros((3, 8), np.float32)
    seq = drafted_sequence(0.0, [5, 5], logit_bias={5: 10.0})
    tokens, _ = Sampler().verify(logits, [seq], [[5, 5]])
    assert tokens == [[5, 5, 5]]


# --- the engine on the tiny Llama: speculation changes the speed, never the greedy output -------


def test_greedy_output_with_ngram_speculation_equals_plain_decoding(tiny_llama_artifact):
    import os

    from ortserve import LLM
    from ortserve.sampling_params import SamplingParams

    before = os.sched_getaffinity(0)
    prompts = [[100 + i % 7 for i in range(40)], list(range(200, 230)) * 2, [5, 6, 7, 8] * 5]
    params = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=2)
    results = {}
    for mode in ("off", "ngram"):
        llm = LLM(str(tiny_llama_artifact), kv_cache_space=0.05, threads_bind="nobind", speculative=mode)
        results[mode] = llm.generate(prompts, params, use_tqdm=False)
        counters = llm.engine.core.scheduler.counters
        llm.engine.core.block_manager.check_idle()
    os.sched_setaffinity(0, before)
    plain, fast = results["off"], results["ngram"]
    assert counters.num_accepted_tokens > 0  # speculation really ran, and was right at times
    for a, b in zip(plain, fast):
        assert a.outputs[0].token_ids == b.outputs[0].token_ids
        for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):  # the same positions' logits
            assert abs(x.logprob - y.logprob) < 1e-3
