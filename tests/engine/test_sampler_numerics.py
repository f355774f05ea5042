"""Property: every SamplingParams that validates samples a valid token id from any logits, and
never raises (extreme, tiny and denormal values included); the rest are ValueErrors naming a field."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fakes import make_request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ortserve.engine.sampler import Sampler
from ortserve.sampling_params import SamplingParams

V = 300  # more than two sampler chunks, with a short last one

EXTREMES = [0.0, 5e-324, 1e-300, 1e-45, 1e-38, 1e-7, 1e-5, 0.5, 1.0, 2.0, 1e5, 1e38, 1e300]


def extreme_floats(low: float, high: float):
    picks = [x for x in EXTREMES + [-x for x in EXTREMES] if low <= x <= high]
    return st.sampled_from(picks) | st.floats(low, high, allow_nan=False)


params_strategy = st.fixed_dictionaries(
    {
        "temperature": extreme_floats(0.0, 1e300),
        "top_p": extreme_floats(5e-324, 1.0),
        "top_k": st.sampled_from([0, -1, 1, 2, 50, V - 1, V, 10 * V]),
        "min_p": extreme_floats(0.0, 1.0),
        "presence_penalty": extreme_floats(-2.0, 2.0),
        "frequency_penalty": extreme_floats(-2.0, 2.0),
        "repetition_penalty": extreme_floats(5e-324, 2.0),
        "seed": st.none() | st.integers(-(2**63), 2**64 - 1),
        "logit_bias": st.none() | st.dictionaries(st.integers(0, V - 1), extreme_floats(-100.0, 100.0), max_size=8),
        "min_tokens": st.integers(0, 3),
        "stop_token_ids": st.lists(st.integers(0, V - 1), max_size=4),
        "logprobs": st.none() | st.integers(0, 20),
    }
)

logits_strategy = st.sampled_from(["normal", "huge", "tiny", "flat", "nan", "inf"])


def make_logits(kind: str, rows: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 3, size=(rows, V)).astype(np.float32)
    if kind == "huge":
        x *= np.float32(1e37)
    elif kind == "tiny":
        x *= np.float32(1e-40)
    elif kind == "flat":
        x[:] = 7.0
    elif kind == "nan":  # a broken model row must not take the engine down
        x[:, rng.integers(0, V, 3)] = np.nan
    elif kind == "inf":
        x[:, rng.integers(0, V, 2)] = np.float32(np.inf)
    return x


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(params_strategy, min_size=1, max_size=3),
    logits_strategy,
    st.integers(0, 2**32),
    st.lists(st.integers(0, V - 1), max_size=6),
)
def test_any_accepted_parameters_sample_a_valid_token(batch, kind, seed, output):
    seqs = []
    for params in batch:
        try:
            SamplingParams(**params)
        except ValueError as exc:  # rejected: the message names the field
            assert str(exc).split(" ", 1)[0] in params
            continue
        seq = make_request([1, 2, 3, 1], max_tokens=16, **params).sequences[0]
        for token in output:
            seq.append_token(token)
        seqs.append(seq)
    if not seqs:
        return
    logits = make_logits(kind, len(seqs), seed)
    tokens, _ = Sampler().sample(logits, seqs)
    assert len(tokens) == len(seqs)
    assert all(isinstance(t, int) and 0 <= t < V for t in tokens)


def test_tiny_temperature_with_logit_bias_is_greedy_not_nan():
    """The crash of issue #11: temperature 1e-300 + logit_bias gave NaN weights and an IndexError."""
    logits = np.random.default_rng(0).normal(0, 3, size=(1, V)).astype(np.float32)
    seq = make_request([1, 2], temperature=1e-300, logit_bias={5: 3.0}).sequences[0]
    expected = logits.copy()
    expected[0, 5] += 3.0
    tokens, _ = Sampler().sample(logits, [seq])
    assert tokens == [int(expected.argmax())]


@pytest.mark.parametrize("kind", ["huge", "nan", "inf"])
def test_rows_without_a_finite_distribution_fall_back_to_the_processed_argmax(kind):
    logits = make_logits(kind, 1, 3)
    seq = make_request([1, 2], temperature=1.0, seed=1, top_p=0.9).sequences[0]
    expected = np.where(np.isnan(logits[0]), -np.inf, logits[0])
    tokens, _ = Sampler().sample(logits.copy(), [seq])
    if kind == "huge":  # finite but overflowing: shifted, so it still samples near the top
        assert expected[tokens[0]] >= np.sort(expected)[-20]
    else:
        assert tokens == [int(np.argmax(expected))]
