"""Request arrival times: Poisson by default, all at once for an infinite rate."""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.bench.arrivals import arrival_offsets


def test_infinite_rate_sends_everything_at_once():
    assert arrival_offsets(5, float("inf")) == [0.0] * 5


def test_last_arrival_lands_at_num_requests_over_rate():
    offsets = arrival_offsets(200, rate=4.0, seed=3)
    assert offsets[-1] == pytest.approx(200 / 4.0)
    assert all(np.diff(offsets) >= 0)


def test_poisson_gaps_look_exponential():
    gaps = np.diff([0.0] + arrival_offsets(20000, rate=10.0, seed=1))
    assert gaps.mean() == pytest.approx(0.1, rel=0.02)
    assert gaps.std() == pytest.approx(0.1, rel=0.05)  # exponential: std == mean


def test_same_seed_same_schedule():
    assert arrival_offsets(10, 2.0, seed=5) == arrival_offsets(10, 2.0, seed=5)


def test_non_positive_rate_is_rejected():
    with pytest.raises(ValueError, match="--request-rate"):
        arrival_offsets(3, 0.0)
