"""The metric math of `ortserve bench serve`, on synthetic timings, against a direct computation
of vLLM's definitions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ortserve.bench.metrics import RequestResult, calculate_metrics, peak_concurrency, tpot_of


def synthetic(
    start: float, ttft: float, gaps: list[float], tokens: int | None = None, prompt: int = 128
) -> RequestResult:
    return RequestResult(
        success=True,
        prompt_len=prompt,
        output_tokens=tokens if tokens is not None else len(gaps) + 1,
        ttft=ttft,
        itl=list(gaps),
        latency=ttft + sum(gaps),
        start_time=start,
        num_chunks=len(gaps) + 1,
    )


@pytest.fixture
def outputs() -> list[RequestResult]:
    rng = np.random.default_rng(7)
    outs = [
        synthetic(start=0.1 * i, ttft=0.05 + 0.01 * i, gaps=list(rng.uniform(0.02, 0.04, size=9 + i))) for i in range(6)
    ]
    outs.append(RequestResult(success=False, error="HTTP 500"))
    return outs


def test_tpot_is_decode_time_over_tokens_after_the_first():
    out = synthetic(0.0, ttft=0.5, gaps=[0.1, 0.2, 0.3])
    assert tpot_of(out) == pytest.approx((out.latency - 0.5) / 3)


def test_tpot_uses_the_token_count_not_the_chunk_count():
    # 3 chunks carried 7 tokens (a server that batches its deltas): TPOT divides by 7 - 1.
    out = synthetic(0.0, ttft=0.2, gaps=[0.3, 0.3], tokens=7)
    assert tpot_of(out) == pytest.approx(0.6 / 6)


def test_single_token_request_has_no_tpot():
    assert tpot_of(synthetic(0.0, ttft=0.2, gaps=[])) is None


def test_counts_and_throughputs(outputs):
    ok = [o for o in outputs if o.success]
    m = calculate_metrics(outputs, duration_s=2.5)
    assert (m.completed, m.failed) == (6, 1)
    assert m.total_input == 128 * 6
    assert m.total_output == sum(o.output_tokens for o in ok)
    assert m.request_throughput == pytest.approx(6 / 2.5)
    assert m.output_throughput == pytest.approx(m.total_output / 2.5)
    assert m.total_token_throughput == pytest.approx((m.total_input + m.total_output) / 2.5)


def test_distributions_match_numpy(outputs):
    ok = [o for o in outputs if o.success]
    m = calculate_metrics(outputs, duration_s=1.0, percentiles=[50, 99])
    expected = {
        "ttft": [o.ttft for o in ok],
        "tpot": [(o.latency - o.ttft) / (o.output_tokens - 1) for o in ok],
        "itl": [g for o in ok for g in o.itl],  # every gap of every request, pooled
        "e2el": [o.latency for o in ok],
    }
    for key, values in expected.items():
        d = getattr(m, key)
        ms = np.array(values) * 1000
        assert d.mean_ms == pytest.approx(ms.mean()), key
        assert d.median_ms == pytest.approx(np.median(ms)), key
        assert d.std_ms == pytest.approx(ms.std()), key
        assert d.percentiles_ms["p99"] == pytest.approx(np.percentile(ms, 99)), key
        assert d.percentiles_ms["p50"] == pytest.approx(d.median_ms), key


def test_itl_mean_weights_every_chunk_not_every_request():
    a = synthetic(0.0, ttft=0.1, gaps=[0.01] * 9)
    b = synthetic(0.0, ttft=0.1, gaps=[0.1])
    m = calculate_metrics([a, b], duration_s=1.0)
    assert m.itl.mean_ms == pytest.approx((9 * 10 + 100) / 10)
    assert m.tpot.mean_ms == pytest.approx((10 + 100) / 2)


def test_no_successful_request_reports_zeros_not_nan():
    m = calculate_metrics([RequestResult(success=False)], duration_s=1.0)
    assert m.completed == 0 and m.failed == 1
    assert m.ttft.mean_ms == 0 and not math.isnan(m.itl.percentiles_ms["p99"])


def test_peak_concurrency_uses_half_open_intervals():
    a = synthetic(0.0, ttft=1.0, gaps=[])  # [0, 1)
    b = synthetic(1.0, ttft=1.0, gaps=[])  # [1, 2): touches a, does not overlap it
    c = synthetic(0.5, ttft=1.0, gaps=[])  # [0.5, 1.5): overlaps both
    assert peak_concurrency([a, b]) == 1
    assert peak_concurrency([a, b, c]) == 2
