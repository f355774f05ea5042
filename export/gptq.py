"""Error-compensating quantisation of a linear (GPTQ, Frantar et al. 2022), on ``qweight``'s grid of
``w = d * q + m`` per row and block of 32 columns, without torch.

The quantity kept small is the error of the layer's output on calibration text, ||(W - Q) X||^2, whose
Hessian in W is the inputs' Gram matrix H = X X^T (``calibration.Importance.gram``). Columns are
rounded one at a time, left to right; each rounding error is spread over the columns not yet rounded
by the inverse Hessian's Cholesky factor, so correlated inputs absorb it. Each block's d and m are
chosen when the block starts, by ``qweight.quantize_q``'s importance-weighted search on the block's
weights as updated so far (llama.cpp's make_qkx2 search with diag(H) as the importance).
"""

from __future__ import annotations

import numpy as np
from ortserve.ops.matmul_q_reference import Q_BLOCK

from .qweight import QWeight, map_rows, quantize_q, search_rows

DAMPING = 1.0  # x mean(diag H) on the diagonal, chosen on prose unlike the calibration text (tables/gptq.md)
_ROWS = 2048  # rows per pass: bounds the temporaries of a wide linear
# GPTQ below this many bits. An 8-bit grid is fine enough that the diagonal-weighted search alone
# keeps Gemma-3-270m's answers (int8: 100 % top-1, tables/quality.md), and GPTQ costs 4x the search:
# minutes on a 262k-row LM head.
GPTQ_BELOW_BITS = 8


def quantize_calibrated(weight: np.ndarray, bits: int, gram: np.ndarray) -> QWeight:
    """Calibrated rounding: GPTQ below ``GPTQ_BELOW_BITS``, else (or with only the diagonal of the Gram matrix,
    [K], where memory did not allow the matrix) the search weighted by diag(gram)."""
    if gram.ndim == 1:
        return quantize_q(weight, bits, gram.astype(np.float32))
    if bits >= GPTQ_BELOW_BITS:
        return quantize_q(weight, bits, np.diag(gram).astype(np.float32))
    return quantize_gptq(weight, bits, gram)


def quantize_gptq(weight: np.ndarray, bits: int, gram: np.ndarray) -> QWeight:
    """Float [N, K] weights and their input's Gram matrix [K, K] (mean x x^T on text) -> codes and
    block scales, rounded in order of decreasing input energy (GPTQ's act-order: the columns that
    matter most are rounded first, while the most columns are left to absorb their error)."""
    k = weight.shape[1]
    assert gram.shape == (k, k), (gram.shape, k)
    importance = np.diag(gram).astype(np.float32)
    order = np.argsort(-importance, kind="stable")
    factor, dead = _inverse_cholesky(gram[np.ix_(order, order)])
    dead = dead[np.argsort(order)]
    return map_rows(
        lambda start, stop: _quantize_rows(weight[start:stop], bits, importance, order, factor, dead),
        len(weight),
        _ROWS,
    )


def _inverse_cholesky(gram: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(upper U with U^T U = (H + damping)^-1, float32; the columns whose input is always zero). With
    H = R R^T, R upper (the Cholesky factor of H with rows and columns reversed), U is R^-1: one
    factorisation and one triangular inverse, not a full inverse and a second factorisation."""
    h = gram.astype(np.float64)
    dead = np.diag(h) <= 0
    h[dead, dead] = 1.0
    damping = DAMPING * float(np.diag(h).mean())
    for _ in range(8):
        try:
            r = np.linalg.cholesky(h[::-1, ::-1] + damping * np.eye(len(h)))[::-1, ::-1]
            return _upper_inverse(r).astype(np.float32), dead
        except np.linalg.LinAlgError:
            damping *= 10
    raise np.linalg.LinAlgError("the calibration Gram matrix stays singular after damping")


def _upper_inverse(r: np.ndarray) -> np.ndarray:
    """The inverse of an upper-triangular matrix, by halves: [[A, B], [0, C]]^-1 = [[A^-1, -A^-1 B
    C^-1], [0, C^-1]]."""
    k = len(r)
    if k <= 128:
        return np.triu(np.linalg.inv(r))
    half = k // 2
    a, c = _upper_inverse(r[:half, :half]), _upper_inverse(r[half:, half:])
    out = np.zeros_like(r)
    out[:half, :half], out[half:, half:] = a, c
    out[:half, half:] = -(a @ r[:half, half:]) @ c
    return out


def _quantize_rows(
    weight: np.ndarray, bits: int, importance: np.ndarray, order: np.ndarray, factor: np.ndarray, dead: np.ndarray
) -> QWeight:
    """Columns in ``order`` (``factor`` is in that order); updates to later columns are applied a batch
    of 32 at a time, and a block's d and m are chosen when its first column comes up, from its
    weights with the pending updates applied. The work is on the transpose, so that a column is a
    contiguous row."""
    w = weight.T.astype(np.float32)  # [K, N]
    w[dead] = 0.0
    w = w[order]
    k, n = w.shape
    position = np.argsort(order)  # original column -> its place in ``order``
    levels = np.float32((1 << bits) - 1)
    blocks = -(-k // Q_BLOCK)
    d, m = np.zeros((blocks, n), np.float32), np.zeros((blocks, n), np.float32)
    chosen = np.zeros(blocks, bool)
    codes = np.zeros((k, n), np.uint8)
    for b0 in range(0, k, Q_BLOCK):
        b1 = min(b0 + Q_BLOCK, k)
        errors = np.zeros((b1 - b0, n), np.float32)
        for j in range(b0, b1):
            block = order[j] // Q_BLOCK
            if not chosen[block]:
                places = position[block * Q_BLOCK : (block + 1) * Q_BLOCK]
                later = places[places >= b1]  # not yet updated by this batch's errors
                current = w[places]
                current[places >= b1] -= factor[b0:j][:, later].T @ errors[: j - b0]
                grid = search_rows(current.T, bits, importance[block * Q_BLOCK : (block + 1) * Q_BLOCK])
                d[block], m[block], chosen[block] = grid.d[:, 0], grid.m[:, 0], True
            db, mb = d[block], m[block]
            q = np.where(db != 0, np.clip(np.rint((w[j] - mb) / np.where(db != 0, db, 1)), 0, levels), 0)
            codes[j] = q
            error = (w[j] - (db * q + mb)) / factor[j, j]
            w[j + 1 : b1] -= np.outer(factor[j, j + 1 : b1], error)
            errors[j - b0] = error
        w[b1:] -= factor[b0:b1, b1:].T @ errors
    return QWeight(np.ascontiguousarray(codes[position].T), np.ascontiguousarray(d.T), np.ascontiguousarray(m.T), bits)
