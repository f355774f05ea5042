"""GPTQ on the MatMulQ grid: the layer output error on inputs it did not see is lower than the
diagonal-weighted search's (the quantity it minimises, measured independently of it); weights
already on the grid come back exactly; inputs that are always zero cost nothing. Its effect on a
real model is measured in benchmarks/tables/quality.md (Gemma-3-270m int4)."""

from __future__ import annotations

import numpy as np
import pytest
from ortserve.export.gptq import GPTQ_BELOW_BITS, quantize_calibrated, quantize_gptq
from ortserve.export.qweight import quantize_q


def correlated_inputs(rng: np.random.Generator, tokens: int, k: int, mixing: np.ndarray) -> np.ndarray:
    """Inputs with a few loud columns (gamma-distributed scales) mixed across columns, as a layer's
    inputs after a norm are: strongly correlated, unlike independent noise."""
    scales = np.linspace(0.2, 3.0, k, dtype=np.float32) ** 2
    return (rng.standard_normal((tokens, k)).astype(np.float32) * scales) @ mixing


def output_error(weight: np.ndarray, quantised: np.ndarray, x: np.ndarray) -> float:
    return float((((quantised - weight) @ x.T) ** 2).mean())


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_gptq_lowers_the_output_error_on_unseen_inputs(bits):
    rng = np.random.default_rng(7)
    k, n = 256, 192
    mixing = np.eye(k, dtype=np.float32) + rng.standard_normal((k, k)).astype(np.float32) * 0.15
    seen, unseen = (correlated_inputs(rng, 4096, k, mixing) for _ in range(2))
    weight = rng.standard_t(5, size=(n, k)).astype(np.float32) * 0.02
    gram = seen.T @ seen / len(seen)
    gptq = quantize_gptq(weight, bits, gram)
    searched = quantize_q(weight, bits, np.diag(gram).copy())
    assert gptq.codes.max() < 1 << bits and gptq.d.shape == searched.d.shape
    assert output_error(weight, gptq.dequantize(), unseen) < 0.7 * output_error(weight, searched.dequantize(), unseen)


def test_calibrated_rounding_is_gptq_below_8_bits_and_the_weighted_search_at_8():
    """At 8 bits the grid is fine enough that GPTQ changes no measured answer (tables/quality.md),
    and on a 262k-row LM head it costs minutes; the export rounds 8-bit linears by the search."""
    rng = np.random.default_rng(2)
    weight = rng.standard_normal((64, 128)).astype(np.float32)
    x = rng.standard_normal((512, 128)).astype(np.float32)
    gram = x.T @ x / len(x)
    assert GPTQ_BELOW_BITS == 8
    for bits in (4, 5):
        assert np.array_equal(quantize_calibrated(weight, bits, gram).codes, quantize_gptq(weight, bits, gram).codes)
    searched = quantize_q(weight, 8, np.diag(gram).copy())
    assert np.array_equal(quantize_calibrated(weight, 8, gram).codes, searched.codes)
    assert not np.array_equal(quantize_gptq(weight, 8, gram).codes, searched.codes)


def test_weights_on_the_grid_come_back_exactly():
    rng = np.random.default_rng(1)
    d = rng.uniform(0.01, 0.02, (16, 4)).astype(np.float16).astype(np.float32)
    m = rng.uniform(-0.2, -0.1, (16, 4)).astype(np.float16).astype(np.float32)
    codes = rng.integers(0, 16, (16, 128)).astype(np.float32)
    codes[:, ::32], codes[:, 1::32] = 0, 15  # every block spans the whole grid
    grid = codes * np.repeat(d, 32, axis=1) + np.repeat(m, 32, axis=1)
    x = correlated_inputs(rng, 512, 128, np.eye(128, dtype=np.float32) + 0.1)
    assert np.array_equal(quantize_gptq(grid, 4, x.T @ x / len(x)).dequantize(), grid)


def test_a_column_whose_input_is_always_zero_costs_nothing():
    rng = np.random.default_rng(2)
    x = correlated_inputs(rng, 1024, 64, np.eye(64, dtype=np.float32))
    x[:, 5] = 0.0
    weight = rng.standard_normal((32, 64)).astype(np.float32)
    weight[:, 5] = 100.0  # would stretch its block's grid if it counted
    quantised = quantize_gptq(weight, 4, x.T @ x / len(x)).dequantize()
    assert np.isfinite(quantised).all()
    alive = np.arange(64) != 5
    searched = quantize_q(weight[:, alive], 4).dequantize()
    assert output_error(weight, quantised, x) < output_error(weight[:, alive], searched, x[:, alive])
