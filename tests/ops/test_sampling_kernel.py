"""The sampler's one-pass e^x and chunk sums (contrib_ops/sampling_kernel.cc) against numpy: every
ISA build, vocabularies that end mid-vector and mid-chunk, and the values the sampler relies on."""

from __future__ import annotations

import numpy as np
import pytest

from ortserve.ops.sampling import exp_chunk_sums


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("vocab, chunk", [(49_152, 128), (50_257, 128), (37, 16), (5, 128)])
def test_every_kernel_build_matches_numpy(isa, vocab, chunk, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the build the library picks
    rng = np.random.default_rng(vocab)
    x = (rng.standard_normal((4, vocab)) * 20).astype(np.float32)  # spans e^-87 .. e^88
    w = np.empty_like(x)
    sums = exp_chunk_sums(x, w, chunk)
    with np.errstate(over="ignore", under="ignore"):
        reference = np.exp(x.astype(np.float64))
    inside = (x > -87) & (x < 88)
    np.testing.assert_allclose(w[inside], reference[inside], rtol=3e-7)
    assert (w[x < -87] == 0).all() and np.isinf(w[x > 88]).all()
    finite = np.where(np.isfinite(w), w, 0).astype(np.float64)
    starts = np.arange(0, vocab, chunk)
    rows = np.isfinite(w).all(axis=1)  # a row with an overflow sums to inf, as numpy's would
    np.testing.assert_allclose(sums[rows], np.add.reduceat(finite, starts, axis=1)[rows], rtol=1e-5)
    assert np.isinf(sums[~rows]).any(axis=1).all()


def test_masked_tokens_weigh_nothing_and_nan_stays_nan():
    x = np.array([[0.0, -np.inf, np.nan, 88.5, -87.5, 1.0]], np.float32)
    w = np.empty_like(x)
    sums = exp_chunk_sums(x, w, 4)
    assert w[0, 0] == 1.0 and w[0, 1] == 0.0 and np.isnan(w[0, 2]) and np.isinf(w[0, 3]) and w[0, 4] == 0.0
    assert np.isnan(sums[0, 0]) and sums[0, 1] == pytest.approx(np.e)


def test_arrays_that_are_not_float32_rows_are_refused():
    with pytest.raises(ValueError, match="float32"):
        exp_chunk_sums(np.zeros((2, 8)), np.zeros((2, 8)), 4)
    with pytest.raises(ValueError, match="C-contiguous"):
        x = np.zeros((8, 2), np.float32).T
        exp_chunk_sums(x, np.empty_like(x), 4)


def test_an_empty_isa_cap_is_no_cap(monkeypatch):
    # On an AVX-512 machine the AVX2 build sums in another order, so a cap at AVX2 would show here.
    x = (np.random.default_rng(3).standard_normal((4, 50_257)) * 4).astype(np.float32)
    monkeypatch.delenv("ORTSERVE_KERNEL_ISA", raising=False)
    default = exp_chunk_sums(x, np.empty_like(x), 4096).copy()
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", "")
    np.testing.assert_array_equal(exp_chunk_sums(x, np.empty_like(x), 4096), default)
