"""The scale search of ``qweight`` against a plain reference written here: for every block it returns
the candidate of least weighted squared error among the grids it tries (each grid's own d and m and
the least-squares d and m of its codes, fp16), the error summed directly in float64; chunks of rows
on threads give the same codes as one pass. GPTQ's factor U satisfies U^T U = (H + damping)^-1,
checked against numpy's inverse."""

from __future__ import annotations

import numpy as np
import pytest
from ortserve.export import gptq
from ortserve.export.nbits import SCALE_CANDIDATES, WIDE_SCALE_CANDIDATES
from ortserve.export.qweight import quantize_q, search_rows


def half(a):
    return np.float64(np.float16(a))


def block_candidates(x: np.ndarray, h: np.ndarray, bits: int, factors, shifts) -> list[tuple[float, float, np.ndarray]]:
    """Every (d, m, codes) the search may return for one block of 32 weights x, error weights h."""
    levels = 2**bits - 1
    lo, hi = float(x.min()), float(x.max())
    grids = []
    for factor in factors:
        step = (np.float32(hi) - np.float32(lo)) / np.float32(levels) * np.float32(factor)
        for shift in shifts:
            base = np.float32(lo) + np.float32(shift) * step
            grids.append((float(base), float(step) if step > 0 else 1.0, half(step), half(base)))
    zero = 2 ** (bits - 1)
    extreme = float(x[np.argmax(np.abs(x))])
    for d in (half(np.float32(extreme) / np.float32(-zero)), half(np.float32(abs(extreme)) / np.float32(zero - 1))):
        grids.append((half(-zero * d), d if d != 0 else 1.0, d, half(-zero * d)))
    out = []
    for base, scale, d, m in grids:
        q = np.clip(np.rint((x.astype(np.float64) - base) / scale), 0, levels)
        qc = q - (h * q).sum() / h.sum()
        fit_d = half((h * qc * x).sum() / (h * qc * qc).sum()) if (h * qc * qc).sum() > 0 else 0.0
        fit_m = half((h * (x - fit_d * q)).sum() / h.sum())
        out += [(fit_d, fit_m, q), (d, m, q)]
    return out


@pytest.mark.parametrize("bits, calibrated", [(4, False), (4, True), (8, False), (5, True)])
def test_the_search_returns_the_least_error_candidate_of_every_block(bits, calibrated):
    rng = np.random.default_rng(bits + calibrated)
    w = (rng.standard_t(4, size=(6, 96)) * 0.05).astype(np.float32)
    w[0, :32] = 0.125  # a constant block
    importance = rng.uniform(0.01, 4.0, 96).astype(np.float32) if calibrated else None
    got = search_rows(w, bits, importance)
    factors, shifts = (WIDE_SCALE_CANDIDATES, (0.0, 0.25, -0.25)) if calibrated else (SCALE_CANDIDATES, (0.0,))
    for row in range(w.shape[0]):
        sigma2 = float((w[row].astype(np.float32) ** 2).mean())
        for block in range(3):
            x = w[row, block * 32 : (block + 1) * 32].astype(np.float64)
            if calibrated:
                imp = importance[block * 32 : (block + 1) * 32] + 1e-3 * importance.mean()
                h = imp.astype(np.float64) * np.sqrt(sigma2 + x * x)
            else:
                h = np.ones(32)
            errors = [
                float((h * (d * q + m - x) ** 2).sum()) for d, m, q in block_candidates(x, h, bits, factors, shifts)
            ]
            d, m = got.d[row, block], got.m[row, block]
            q = got.codes[row, block * 32 : (block + 1) * 32].astype(np.float64)
            chosen = float((h * (d * q + m - x) ** 2).sum())
            assert chosen <= min(errors) * (1 + 1e-4) + 1e-12, (row, block, chosen, min(errors))


def test_rows_chunked_on_threads_equal_one_pass():
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((301, 160)) * 0.05).astype(np.float32)
    importance = rng.uniform(0.1, 2.0, 160).astype(np.float32)
    one, chunked = search_rows(w, 4, importance), quantize_q(w, 4, importance)
    for field in ("codes", "d", "m"):
        assert np.array_equal(getattr(one, field), getattr(chunked, field)), field


def test_gptq_factor_is_the_upper_cholesky_factor_of_the_damped_inverse():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((400, 300)) * rng.uniform(0.1, 3.0, 300)
    gram = x.T @ x / len(x)
    u, dead = gptq._inverse_cholesky(gram)
    expected = np.linalg.inv(gram + gptq.DAMPING * np.diag(gram).mean() * np.eye(300))
    assert not dead.any() and np.array_equal(u, np.triu(u)) and (np.diag(u) > 0).all()
    np.testing.assert_allclose(u.T.astype(np.float64) @ u, expected, rtol=1e-5, atol=1e-6 * np.abs(expected).max())
