"""Sampler against direct numpy computations on fixed logits."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fakes import EOS, make_request

from ortserve.engine.sampler import Sampler

V = 64


def fixed_logits(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 2, size=(rows, V)).astype(np.float32)


def seq_with(prompt=(3, 4, 5, 4), output=(), **params):
    params.setdefault("temperature", 1.0)
    seq = make_request(list(prompt), **params).sequences[0]
    for t in output:
        seq.append_token(t)
    return seq


def reference_probs(logits, seq) -> np.ndarray:
    """The spec, written plainly for one row."""
    p = seq.request.params
    x = logits.astype(np.float64).copy()
    prompt, out = list(seq.token_ids[: seq.num_prompt_tokens]), seq.token_ids[seq.num_prompt_tokens :].tolist()
    if len(out) < p.min_tokens:
        for t in [EOS] + list(p.stop_token_ids or []):
            x[t] = -np.inf
    for t, b in (p.logit_bias or {}).items():
        x[t] += b
    for t in set(prompt) | set(out):
        x[t] = x[t] / p.repetition_penalty if x[t] > 0 else x[t] * p.repetition_penalty
    for t in set(out):
        x[t] -= p.frequency_penalty * out.count(t) + p.presence_penalty
    if p.temperature == 0:
        probs = np.zeros(V)
        probs[np.argmax(x)] = 1
        return probs
    x = x / p.temperature
    probs = np.exp(x - x.max())
    probs /= probs.sum()
    if p.min_p:
        probs[probs < p.min_p * probs.max()] = 0
    if p.top_k:
        probs[probs < np.sort(probs)[-p.top_k]] = 0
    probs /= probs.sum()
    if p.top_p < 1:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        keep = order[: np.searchsorted(cum, p.top_p) + 1]  # smallest prefix reaching top_p
        mask = np.zeros(V, bool)
        mask[keep] = True
        probs[~mask] = 0
    return probs / probs.sum()


def sampled_distribution(logits: np.ndarray, seqs) -> np.ndarray:
    """What each row samples from: the sampler's processors, then its weights (greedy: one-hot)."""
    sampler = Sampler()
    sampler._apply_processors(logits, seqs)
    probs = np.zeros_like(logits)
    for i, seq in enumerate(seqs):
        if seq.params.greedy:
            probs[i, logits[i].argmax()] = 1.0
        else:
            w = sampler._weights(logits[i : i + 1].copy(), [seq])[0][0]
            probs[i] = w / w.sum()
    return probs


CASES = {
    "plain": {},
    "temperature": {"temperature": 0.5},
    "top_k": {"top_k": 5},
    "top_p": {"top_p": 0.6},
    "min_p": {"min_p": 0.2},
    "top_k+top_p+min_p": {"top_k": 10, "top_p": 0.8, "min_p": 0.05, "temperature": 1.3},
    "repetition": {"repetition_penalty": 1.5, "output": (4, 9, 9)},
    "frequency+presence": {"frequency_penalty": 0.7, "presence_penalty": 0.4, "output": (7, 7, 7, 1)},
    "logit_bias": {"logit_bias": {11: 5.0, 12: -100.0}},
    "min_tokens": {"min_tokens": 3, "stop_token_ids": [13], "output": (1,)},
    "greedy+penalties": {"temperature": 0.0, "repetition_penalty": 1.9, "frequency_penalty": 1.0, "output": (5, 5)},
}


@pytest.mark.parametrize("case", CASES)
def test_probabilities_match_numpy_reference(case):
    params = dict(CASES[case])
    output = params.pop("output", ())
    logits = fixed_logits(1, seed=list(CASES).index(case))
    seq = seq_with(output=output, **params)
    expected = reference_probs(logits[0], seq)
    got = sampled_distribution(logits.copy(), [seq])[0]
    np.testing.assert_allclose(got, expected, atol=1e-6)


def test_batched_rows_with_mixed_params_equal_each_row_alone():
    cases = [dict(CASES[c]) for c in CASES]
    seqs = [seq_with(output=c.pop("output", ()), **c) for c in cases]
    logits = fixed_logits(len(seqs), seed=7)
    together = sampled_distribution(logits.copy(), seqs)
    for i, seq in enumerate(seqs):
        np.testing.assert_allclose(together[i], reference_probs(logits[i], seq), atol=1e-6)


def test_greedy_is_argmax_and_batch_greedy_path_agrees():
    logits = fixed_logits(4)
    seqs = [seq_with(temperature=0.0) for _ in range(4)]
    tokens, logprobs = Sampler().sample(logits.copy(), seqs)
    assert tokens == logits.argmax(axis=1).tolist() and logprobs is None


def test_min_tokens_blocks_eos_and_stop_ids():
    logits = np.zeros((1, V), np.float32)
    logits[0, EOS] = 50.0
    logits[0, 13] = 49.0
    seq = seq_with(temperature=0.0, min_tokens=2, stop_token_ids=[13])
    tokens, _ = Sampler().sample(logits.copy(), [seq])
    assert tokens[0] not in (EOS, 13)


def test_samples_follow_the_processed_distribution():
    logits = fixed_logits(1, seed=3)[:, :]
    params = {"top_k": 6, "top_p": 0.9, "temperature": 0.8}
    probs = reference_probs(logits[0], seq_with(**params))
    sampler = Sampler()
    draws = 4000
    seqs = [seq_with(seed=i, **params) for i in range(draws)]
    tokens, _ = sampler.sample(np.repeat(logits, draws, axis=0), seqs)
    freq = np.bincount(tokens, minlength=V) / draws
    assert set(np.flatnonzero(freq)) <= set(np.flatnonzero(probs))
    np.testing.assert_allclose(freq, probs, atol=0.03)


def test_seeded_sampling_is_reproducible_across_batch_compositions():
    logits = fixed_logits(6, seed=11)

    def run(order, others_seeded):
        seqs = {}
        for i in order:
            seqs[i] = seq_with(seed=1234 if i == 0 else (i if others_seeded else None), top_p=0.95)
        rows = [logits[i] for i in order]
        out = []
        for _ in range(20):
            tokens, _ = Sampler().sample(np.stack(rows).copy(), [seqs[i] for i in order])
            out.append(tokens[order.index(0)])
        return out

    alone = run([0], True)
    assert alone == run([3, 0, 5], False) == run([5, 4, 3, 2, 1, 0], True)
    assert len(set(alone)) > 1  # it really samples


def test_different_seeds_and_sample_indices_differ():
    logits = np.zeros((1, V), np.float32)
    a = make_request([1, 2], seed=5, n=2, temperature=1.0)
    a.fork()
    draws = {i: [] for i in range(2)}
    for _ in range(10):
        for i, seq in enumerate(a.sequences):
            draws[i].append(Sampler().sample(logits.copy(), [seq])[0][0])
    assert draws[0] != draws[1]


def test_logprobs_are_raw_log_softmax_with_rank_and_top_k():
    logits = fixed_logits(2, seed=5)
    seqs = [seq_with(temperature=0.0, logprobs=3, repetition_penalty=2.0, output=(1,)), seq_with(temperature=0.0)]
    tokens, logprobs = Sampler().sample(logits.copy(), seqs)
    raw = logits[0].astype(np.float64) - np.log(np.exp(logits[0].astype(np.float64)).sum())
    entry = logprobs[0]
    assert entry.logprob == pytest.approx(raw[tokens[0]], abs=1e-5)
    assert entry.rank == 1 + int((raw > raw[tokens[0]]).sum())
    assert [t for t, _ in entry.top_logprobs] == np.argsort(-raw)[:3].tolist()
    np.testing.assert_allclose([lp for _, lp in entry.top_logprobs], np.sort(raw)[::-1][:3], atol=1e-5)
    assert logprobs[1] is None


def test_logprobs_zero_gives_only_the_sampled_token():
    seq = seq_with(temperature=0.0, logprobs=0)
    _, logprobs = Sampler().sample(fixed_logits(1), [seq])
    assert logprobs[0].top_logprobs == [] and logprobs[0].rank == 1


def test_two_level_draw_equals_a_full_inverse_cdf():
    from ortserve.engine.sampler import draw

    rng = np.random.default_rng(0)
    weights = np.exp(rng.normal(0, 3, size=(16, 1000))).astype(np.float32)
    weights[:, rng.random(1000) < 0.5] = 0.0  # truncated distributions have zero runs
    u = rng.random(16)
    cdf = np.cumsum(weights.astype(np.float64), axis=1)
    expected = [int(np.searchsorted(cdf[i], u[i] * cdf[i, -1], side="right")) for i in range(16)]
    assert draw(weights, u, chunk=64).tolist() == expected
    assert all(weights[i, t] > 0 for i, t in enumerate(draw(weights, np.zeros(16), chunk=64)))
    assert all(weights[i, t] > 0 for i, t in enumerate(draw(weights, np.full(16, 1 - 1e-12), chunk=64)))


def test_top_p_candidate_shortcut_and_its_full_sort_fallback_agree_with_the_reference(monkeypatch):
    import ortserve.engine.sampler as sampler_module

    monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", 8)
    seqs = [seq_with(top_p=p, temperature=t) for p, t in ((0.2, 0.5), (0.99, 1.0), (0.5, 2.0), (0.9, 0.7))]
    logits = fixed_logits(len(seqs), seed=21)
    weights, _ = Sampler()._weights(logits.copy(), seqs)  # all rows in one batch: both paths at once
    together = weights / weights.sum(axis=1, keepdims=True)
    widths = [(together[i] > 0).sum() for i in range(len(seqs))]
    assert min(widths) <= 8 < max(widths)  # both paths taken
    for i, seq in enumerate(seqs):
        np.testing.assert_allclose(together[i], reference_probs(logits[i], seq), atol=1e-6)


def test_draw_handles_a_short_last_chunk():
    from ortserve.engine.sampler import draw

    weights = np.zeros((3, 70), np.float32)
    weights[:, 69] = 1.0  # all the mass in the short last chunk
    weights[1, 3] = 1.0
    assert draw(weights, np.array([0.0, 0.9, 0.999]), chunk=32).tolist() == [69, 69, 69]
    assert draw(weights, np.array([0.0, 0.1, 0.5]), chunk=32).tolist()[1] == 3


def test_large_or_very_negative_logits_are_shifted_and_rows_stay_independent():
    logits = fixed_logits(3, seed=9)
    logits[0] += 500.0  # exp would overflow without the shift
    logits[1] -= 500.0  # and underflow to all zeros
    for params in ({"top_p": 0.9, "min_p": 0.01}, {}):  # truncated rows, and plain ones redone
        seqs = [seq_with(**params) for _ in range(3)]
        together = Sampler()._weights(logits.copy(), seqs)[0].copy()
        for i, seq in enumerate(seqs):
            np.testing.assert_allclose(together[i] / together[i].sum(), reference_probs(logits[i], seq), atol=1e-6)
        alone = Sampler()._weights(logits[2:3].copy(), seqs[2:3])[0][0]
        assert np.array_equal(alone, together[2])  # bit for bit, whatever the other rows needed
