"""4- and 8-bit weights for ``ortserve.MatMulQ4`` / ``MatMulQ8``: ``w = d * q + m`` per row and block of
32 columns, codes q in 0..15 or 0..255 and a float scale d and minimum m per block (llama.cpp's Q4_1
form).

Every GGUF format with blocks of 32 is this form exactly (``from_blocks``: Q4_0 has m = -8d, Q4_1 its d
and m, Q4_K d * scale[j] and -dmin * min[j]; Q8_0 q + 128 and m = -128d, Q5_0 m = -16d, Q5_1 and Q5_K
as Q4_1 and Q4_K); float weights are quantised here (``quantize_q``) with d and m that fp16 holds,
searched per block for the least squared error. The scales are stored as fp16 when fp16 holds every
d and m exactly, else as fp32 (the K-quants' products). The ops' layout and their numpy reference are
in ``contrib_ops`` (``pack_q``, ``matmul_q``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from ortserve.ops.paged_attention_reference import Q_BLOCK, pack_q

from .nbits import SCALE_CANDIDATES, WIDE_SCALE_CANDIDATES, QuantizedWeight

_ROWS = 2048  # rows per chunk: bounds the float temporaries of a large embedding


@dataclass(frozen=True)
class QWeight:
    codes: np.ndarray  # uint8 [N, K], 0..2^bits - 1
    d: np.ndarray  # float32 [N, ceil(K / 32)]
    m: np.ndarray  # float32 [N, ceil(K / 32)]
    bits: int  # 4, 5 or 8 (MatMulQ4, MatMulQ5, MatMulQ8)

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes [G, KB, 256 or 512], scales [G, KB, 2, 16]) as the ops read them."""
        exact = all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in (self.d, self.m))
        return pack_q(self.codes, self.d, self.m, self.bits, np.float16 if exact else np.float32)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32: d * q + m, in float32 and in that order (as gguf forms ``d * q + m``)."""
        blocks = np.arange(self.codes.shape[1]) // Q_BLOCK
        return self.codes.astype(np.float32) * self.d[:, blocks] + self.m[:, blocks]


def concat_q(parts: list[QWeight]) -> QWeight:
    """The parts of a fused linear stacked along N (all of one width)."""
    if len(parts) == 1:
        return parts[0]
    fields = (np.concatenate([getattr(p, f) for p in parts]) for f in ("codes", "d", "m"))
    return QWeight(*fields, parts[0].bits)


def from_blocks(q: QuantizedWeight, k: int, bits: int) -> QWeight:
    """A GGUF tensor's codes (``gguf_blocks.import_blocks``, blocks of 32) for MatMulQ{bits}: m = offset -
    d * z, exactly (z * d is exact, and the difference is the format's own m)."""
    assert q.block_size == Q_BLOCK, q.block_size
    n, k_blocks, _ = q.packed.shape
    if q.bits == 4:
        codes = np.stack([q.packed & 0x0F, q.packed >> 4], axis=-1).reshape(n, k_blocks * Q_BLOCK)
    else:
        codes = q.packed.reshape(n, k_blocks * Q_BLOCK)
    zero = q.unpacked_zero_points().astype(np.float32)
    m = -(q.scales * zero) if q.offsets is None else q.offsets - q.scales * zero
    assert int(codes.max(initial=0)) < 1 << bits, bits
    return QWeight(np.ascontiguousarray(codes[:, :k]), q.scales, np.ascontiguousarray(m, np.float32), bits)


def quantize_q(weight: np.ndarray, bits: int, importance: np.ndarray | None = None) -> QWeight:
    """Float [N, K] weights: per block, the best of steps (max - min) / levels shrunk by the candidate
    factors, each with its codes refitted by least squares to (d, m) and rounded to fp16 (llama.cpp's
    make_qkx2_quants idea); weights already on such a grid (dequantised Q4_1) come back exactly.

    ``importance`` [K] (``calibration.Importance``: each input column's mean x^2 on text) weights
    each column's squared error, as llama.cpp's quantisers use an importance matrix (with a floor of
    1e-3 of its mean so that no column is free, and llama.cpp's sqrt(sigma^2 + w^2) per weight); the
    search then also tries the grid shifted by a quarter step either way and more factors."""
    parts = [_quantize_rows(weight[r : r + _ROWS], bits, importance) for r in range(0, len(weight), _ROWS)]
    return concat_q(parts)


def _half(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _error_weights(
    importance: np.ndarray | None, weight: np.ndarray, blocks: np.ndarray
) -> tuple[np.ndarray, np.ndarray, tuple[float, ...]]:
    """(error weights broadcast to ``blocks`` [N, KB, 32], scale factors, grid shifts) of the search. With
    calibration, llama.cpp's per-weight form: importance[k] * sqrt(sigma^2 + w^2), sigma^2 the row's mean
    w^2, so large weights of an important column count most."""
    if importance is None or not importance.mean() > 0:
        return np.ones((1,) + blocks.shape[1:], np.float32), SCALE_CANDIDATES, (0.0,)
    k = weight.shape[1]
    h = np.pad(importance.astype(np.float32), (0, -k % Q_BLOCK))
    h = (h + np.float32(1e-3) * h[:k].mean()).reshape(1, -1, Q_BLOCK)
    sigma2 = (weight.astype(np.float32) ** 2).mean(-1)[:, None, None]
    return h * np.sqrt(sigma2 + blocks * blocks), WIDE_SCALE_CANDIDATES, (0.0, 0.25, -0.25)


def _quantize_rows(weight: np.ndarray, bits: int, importance: np.ndarray | None) -> QWeight:
    n, k = weight.shape
    padded = np.pad(weight.astype(np.float32), ((0, 0), (0, -k % Q_BLOCK)), mode="edge")
    blocks = padded.reshape(n, -1, Q_BLOCK)
    weights, factors, shifts = _error_weights(importance, weight, blocks)
    best_error = np.full(blocks.shape[:2], np.inf, np.float32)
    best = (np.zeros(blocks.shape, np.float32), np.zeros(blocks.shape[:2], np.float32), _half(blocks.min(-1)))
    for codes, step, base in _grids(blocks, bits, factors, shifts):
        for d, m in (_fit(blocks, codes, weights), (step, base)):
            error = (weights * (d[..., None] * codes + m[..., None] - blocks) ** 2).sum(-1)
            better = error < best_error
            best_error = np.where(better, error, best_error)
            best = (
                np.where(better[..., None], codes, best[0]),
                np.where(better, d, best[1]),
                np.where(better, m, best[2]),
            )
    codes, d, m = best
    codes = codes.reshape(n, -1)[:, :k].astype(np.uint8)
    return QWeight(np.ascontiguousarray(codes), d.astype(np.float32), m.astype(np.float32), bits)


def _grids(
    blocks: np.ndarray, bits: int, factors: np.ndarray, shifts: tuple[float, ...]
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(codes, d, m) per block to try: from the minimum, steps of (max - min) / levels x each factor
    (the grid shifted by each shift, in steps); then llama.cpp's symmetric grids, m = -z * d with z =
    2^(bits - 1) and d = -max / z (Q4_0, Q5_0) or |max| / (z - 1) (Q8_0), max the block's value of the
    largest magnitude, so weights already on one of those grids come back exactly."""
    levels = np.float32((1 << bits) - 1)
    lo, hi = blocks.min(-1), blocks.max(-1)
    for factor in factors:
        step = (hi - lo) / levels * factor
        safe = np.where(step > 0, step, np.float32(1))
        for shift in shifts:
            base = lo + np.float32(shift) * step
            yield np.clip(np.rint((blocks - base[..., None]) / safe[..., None]), 0, levels), _half(step), _half(base)
    zero = np.float32(1 << (bits - 1))
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    for d in (_half(extreme / -zero), _half(np.abs(extreme) / (zero - 1))):
        safe = np.where(d != 0, d, np.float32(1))
        yield np.clip(np.rint(blocks / safe[..., None]) + zero, 0, levels), d, _half(-zero * d)


def _fit(blocks: np.ndarray, codes: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Weighted least squares (d, m) of w ~ d * q + m per block, rounded to fp16."""
    total = weights.sum(-1)
    q_mean, w_mean = (weights * codes).sum(-1) / total, (weights * blocks).sum(-1) / total
    q_centred = codes - q_mean[..., None]
    variance = (weights * q_centred * q_centred).sum(-1)
    covariance = (weights * q_centred * blocks).sum(-1)
    d = np.where(variance > 0, covariance / np.maximum(variance, 1e-30), 0).astype(np.float32)
    d = _half(d)
    return d, _half(w_mean - d * q_mean)
