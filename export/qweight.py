"""4- and 8-bit weights for ``ortserve.MatMulQ4`` / ``MatMulQ8``: ``w = d * q + m`` per row and block of
32 columns, codes q in 0..15 or 0..255 and a float scale d and minimum m per block (llama.cpp's Q4_1
form).

Every GGUF format with blocks of 32 is this form exactly (``from_blocks``: Q4_0 has m = -8d, Q4_1 its d and m;
Q8_0 q + 128 and m = -128d, Q5_0 m = -16d, Q5_1 as Q4_1; IQ4_NL and IQ4_XS 4-bit indices of the 8-bit codes
``Q4NL_CODES`` for MatMulQ4NL; the K-quants have ops of their own, ``kquants.py``); float weights are quantised here
(``quantize_q``) with d and m that fp16 holds, searched per block for the least squared error. The scales are stored
as fp16 when fp16 holds every d and m exactly, else as fp32 (IQ4_XS's products). The ops' layout and their
numpy reference are in ``contrib_ops`` (``pack_q``, ``matmul_q``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from ortserve.ops.matmul_q_reference import Q4NL_CODES, Q_BLOCK, pack_q

from .nbits import SCALE_CANDIDATES, WIDE_SCALE_CANDIDATES, QuantizedWeight


@dataclass(frozen=True)
class QWeight:
    codes: np.ndarray  # uint8 [N, K], 0..2^bits - 1
    d: np.ndarray  # float32 [N, ceil(K / 32)]
    m: np.ndarray  # float32 [N, ceil(K / 32)]
    bits: int  # 4, 5 or 8 (MatMulQ4, MatMulQ5, MatMulQ8)
    nonlinear: bool = False  # MatMulQ4NL: the 4-bit codes index Q4NL_CODES, and q is Q4NL_CODES[code]
    centred: bool = False  # m = -middle * d in every block (GGUF's Q4_0, Q5_0, Q8_0, IQ4): MatMulQ4S / ..., d alone

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes [G, KB, 256 or 512], scales [G, KB, 2, 16], or [G, KB, 16] when centred) as the ops read them."""
        stored = (self.d,) if self.centred else (self.d, self.m)
        exact = all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in stored)
        m = None if self.centred else self.m
        return pack_q(self.codes, self.d, m, self.bits, np.float16 if exact else np.float32)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32: d * q + m, in float32 and in that order (as gguf forms ``d * q + m``)."""
        blocks = np.arange(self.codes.shape[1]) // Q_BLOCK
        q = Q4NL_CODES[self.codes] if self.nonlinear else self.codes
        return q.astype(np.float32) * self.d[:, blocks] + self.m[:, blocks]


def concat_q(parts: list[QWeight]) -> QWeight:
    """The parts of a fused linear stacked along N (all of one width)."""
    if len(parts) == 1:
        return parts[0]
    fields = (np.concatenate([getattr(p, f) for p in parts]) for f in ("codes", "d", "m"))
    return QWeight(*fields, parts[0].bits, parts[0].nonlinear, parts[0].centred)


_CHUNK = 1 << 18  # weights per thread task: enough tasks to share out evenly, each worth its dispatch


def map_rows(work: Callable[[int, int], QWeight], rows: int, chunk_rows: int) -> QWeight:
    """``work(start, stop)`` over chunks of at most ``chunk_rows`` rows, and at least one chunk a CPU,
    on a thread per CPU (numpy's array loops run outside the GIL), the parts stacked in order."""
    cpus = len(os.sched_getaffinity(0))
    size = max(1, min(chunk_rows, -(-rows // cpus)))
    starts = range(0, rows, size)
    if len(starts) == 1:
        return work(0, rows)
    with ThreadPoolExecutor(min(cpus, len(starts))) as pool:
        return concat_q(list(pool.map(lambda start: work(start, min(start + size, rows)), starts)))


def from_blocks(q: QuantizedWeight, k: int, bits: int, nonlinear: bool = False, centred: bool = False) -> QWeight:
    """A GGUF tensor's codes (``gguf_blocks.import_blocks``, blocks of 32) for MatMulQ{bits}: m = offset -
    d * z, exactly (z * d is exact, and the difference is the format's own m). ``nonlinear`` (IQ4, for
    MatMulQ4NL): the 8-bit codes become their indices in Q4NL_CODES. ``centred`` (a format whose zero point is
    its codes' middle, without offsets: MatMulQ4S / Q5S / Q8S / Q4NLS): m is not stored, the op forms it."""
    assert q.block_size == Q_BLOCK, q.block_size
    n, k_blocks, _ = q.packed.shape
    if q.bits == 4:
        codes = np.stack([q.packed & 0x0F, q.packed >> 4], axis=-1).reshape(n, k_blocks * Q_BLOCK)
    else:
        codes = q.packed.reshape(n, k_blocks * Q_BLOCK)
    zero = q.unpacked_zero_points().astype(np.float32)
    m = -(q.scales * zero) if q.offsets is None else q.offsets - q.scales * zero
    if nonlinear:  # a block of scale 0 (IQ4_XS's ls = 32) comes with code 128, not in the table: any will do
        indices = np.minimum(np.searchsorted(Q4NL_CODES, codes), 15).astype(np.uint8)
        scale = np.repeat(q.scales, Q_BLOCK, axis=1)[:, : codes.shape[1]]
        assert np.all((Q4NL_CODES[indices] == codes) | (scale == 0)), "codes outside the IQ4 table"
        codes = indices
    assert int(codes.max(initial=0)) < 1 << bits, bits
    if centred:
        middle = 128 if nonlinear else 1 << (bits - 1)
        assert q.offsets is None and np.all(zero == middle), "a centred format's zero point is its codes' middle"
    m = np.ascontiguousarray(m, np.float32)
    return QWeight(np.ascontiguousarray(codes[:, :k]), q.scales, m, bits, nonlinear, centred)


def quantize_q(weight: np.ndarray, bits: int, importance: np.ndarray | None = None) -> QWeight:
    """Float [N, K] weights: per block, the best of steps (max - min) / levels shrunk by the candidate
    factors, each with its codes refitted by least squares to (d, m) and rounded to fp16 (llama.cpp's
    make_qkx2_quants idea); weights already on such a grid (dequantised Q4_1) come back exactly.

    ``importance`` [K] (``calibration.Importance``: each input column's mean x^2 on text) weights
    each column's squared error, as llama.cpp's quantisers use an importance matrix (with a floor of
    1e-3 of its mean so that no column is free, and llama.cpp's sqrt(sigma^2 + w^2) per weight); the
    search then also tries the grid shifted by a quarter step either way and more factors."""
    chunk_rows = max(1, _CHUNK // max(1, weight.shape[1]))
    return map_rows(lambda start, stop: search_rows(weight[start:stop], bits, importance), len(weight), chunk_rows)


def _half(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _search_space(importance: np.ndarray | None) -> tuple[np.ndarray, tuple[float, ...]]:
    """(step factors, grid shifts) the search tries: more of both with calibration."""
    if importance is None or not importance.mean() > 0:
        return SCALE_CANDIDATES, (0.0,)
    return WIDE_SCALE_CANDIDATES, (0.0, 0.25, -0.25)


def _error_weights(importance: np.ndarray | None, weight: np.ndarray, blocks: np.ndarray) -> np.ndarray:
    """The weight of each squared error, broadcast to ``blocks`` [N, KB, 32]. With calibration,
    llama.cpp's per-weight form: importance[k] * sqrt(sigma^2 + w^2), sigma^2 the row's mean w^2, so
    large weights of an important column count most."""
    if importance is None or not importance.mean() > 0:
        return np.ones((1,) + blocks.shape[1:], np.float32)
    k = weight.shape[1]
    h = np.pad(importance.astype(np.float32), (0, -k % Q_BLOCK))
    h = (h + np.float32(1e-3) * h[:k].mean()).reshape(1, -1, Q_BLOCK)
    sigma2 = (weight.astype(np.float32) ** 2).mean(-1)[:, None, None]
    return h * np.sqrt(sigma2 + blocks * blocks)


@dataclass(frozen=True)
class _Grids:
    """Candidate grids [G, N, KB]: codes q = clip(rint(u)), u = (w - base) / scale the weights in steps
    of the grid, and the (d, m), fp16, that each grid itself stands for. The search also tries the
    least-squares (d, m) of the same codes."""

    base: np.ndarray
    scale: np.ndarray  # the grid's step, 1 where that is 0
    d: np.ndarray
    m: np.ndarray


@dataclass(frozen=True)
class _Moments:
    """Weighted sums over each block of 1, q, q^2, r, q r and r^2 (r = u - q; float32 over a block's 32
    weights, combined in float64): with them the squared error of any (d, m) on a grid's codes follows
    in closed form, well conditioned because r and the candidates' offsets from the grid are all of the
    order of one step."""

    s: np.ndarray
    q: np.ndarray
    qq: np.ndarray
    r: np.ndarray
    qr: np.ndarray
    rr: np.ndarray

    def error(self, grids: _Grids, d: np.ndarray, m: np.ndarray) -> np.ndarray:
        """sum w (d q + m - w)^2 = scale^2 sum w (a q + b - r)^2, a = d / scale - 1, b = (m - base) / scale."""
        scale = grids.scale.astype(np.float64)
        a, b = d / scale - 1, (m - grids.base) / scale
        total = a * a * self.qq + 2 * a * b * self.q + b * b * self.s - 2 * a * self.qr - 2 * b * self.r + self.rr
        return scale * scale * total

    def fit(self, grids: _Grids) -> tuple[np.ndarray, np.ndarray]:
        """The weighted least-squares (d, m) of the codes, rounded to fp16."""
        s = np.where(self.s > 0, self.s, 1.0)  # 0 only for a row of zeros, whose sums are all 0
        q_mean, r_mean = self.q / s, self.r / s
        variance, covariance = self.qq - self.q * q_mean, self.qr - self.q * r_mean
        a = np.where(variance > 0, covariance / np.maximum(variance, 1e-300), 0)  # d = scale (1 + a)
        scale = grids.scale.astype(np.float64)
        d = _half((scale * (1 + a)).astype(np.float32))
        b = r_mean - (d / scale - 1) * q_mean  # the best m for the rounded d: base + scale b
        return d, _half((grids.base + scale * b).astype(np.float32))


_STACK = 1 << 20  # the search's candidate codes held at once (grids x rows x K): 4 MiB a temporary


def search_rows(weight: np.ndarray, bits: int, importance: np.ndarray | None) -> QWeight:
    """``quantize_q`` on rows of ``weight`` in this thread, as many rows at a time as ``_STACK`` holds."""
    factors, shifts = _search_space(importance)
    grids = len(factors) * len(shifts) + 2
    rows = max(1, _STACK // (grids * -(-weight.shape[1] // Q_BLOCK) * Q_BLOCK))
    return concat_q([_search(weight[r : r + rows], bits, importance) for r in range(0, len(weight), rows)])


def _search(weight: np.ndarray, bits: int, importance: np.ndarray | None) -> QWeight:
    """Every grid's codes at once; per grid only the weighted moments of its codes are summed, each
    candidate's error then follows in closed form (``_Moments``), and the first least wins."""
    n, k = weight.shape
    padded = np.pad(weight.astype(np.float32), ((0, 0), (0, -k % Q_BLOCK)), mode="edge")
    blocks = padded.reshape(n, -1, Q_BLOCK)
    weights = np.broadcast_to(_error_weights(importance, weight, blocks), blocks.shape)
    levels = np.float32((1 << bits) - 1)
    grids = _grids(blocks, bits, *_search_space(importance))
    steps = (blocks - grids.base[..., None]) * (np.float32(1) / grids.scale)[..., None]  # [G, N, KB, 32]
    codes = np.clip(np.rint(steps), 0, levels)
    steps -= codes
    weighted = weights * codes

    def dot(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        return np.einsum("...k,...k->...", x, y).astype(np.float64)

    def total(x: np.ndarray) -> np.ndarray:
        return np.einsum("...k->...", x).astype(np.float64)

    sq, sqq, sqr = total(weighted), dot(weighted, codes), dot(weighted, steps)
    np.multiply(weights, steps, out=weighted)
    moments = _Moments(total(weights), sq, sqq, total(weighted), sqr, dot(weighted, steps))
    fit_d, fit_m = moments.fit(grids)
    errors = np.stack([moments.error(grids, fit_d, fit_m), moments.error(grids, grids.d, grids.m)], 1)
    best = np.nan_to_num(errors, nan=np.inf).reshape(-1, *errors.shape[2:]).argmin(0)  # per grid: fit, then its own
    grid, own = (best // 2)[None], best % 2 == 1

    def pick(a: np.ndarray) -> np.ndarray:
        return np.take_along_axis(a, grid, 0)[0]

    d, m = np.where(own, pick(grids.d), pick(fit_d)), np.where(own, pick(grids.m), pick(fit_m))
    chosen = np.take_along_axis(codes, grid[..., None], 0)[0].reshape(n, -1)[:, :k]
    return QWeight(np.ascontiguousarray(chosen.astype(np.uint8)), d.astype(np.float32), m.astype(np.float32), bits)


def _grids(blocks: np.ndarray, bits: int, factors: np.ndarray, shifts: tuple[float, ...]) -> _Grids:
    """The grids to try per block, in order: from the minimum, steps of (max - min) / levels x each
    factor (the grid shifted by each shift, in steps); then llama.cpp's symmetric grids, m = -z * d with
    z = 2^(bits - 1) and d = -max / z (Q4_0, Q5_0) or |max| / (z - 1) (Q8_0), max the block's value of
    the largest magnitude, so weights already on one of those grids come back exactly."""
    levels = np.float32((1 << bits) - 1)
    lo, hi = blocks.min(-1), blocks.max(-1)
    step = ((hi - lo) / levels)[None] * factors.astype(np.float32)[:, None, None]  # [F, N, KB]
    base = lo[None, None] + np.asarray(shifts, np.float32)[None, :, None, None] * step[:, None]  # [F, S, N, KB]
    step = np.broadcast_to(step[:, None], base.shape).reshape(-1, *lo.shape)
    base = base.reshape(-1, *lo.shape)
    zero = np.float32(1 << (bits - 1))
    extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)[..., 0]
    symmetric = np.stack([_half(extreme / -zero), _half(np.abs(extreme) / (zero - 1))])
    d = np.concatenate([_half(step), symmetric])
    m = np.concatenate([_half(base), _half(-zero * symmetric)])
    scale = np.concatenate([step, symmetric])
    return _Grids(np.concatenate([base, _half(-zero * symmetric)]), np.where(scale != 0, scale, np.float32(1)), d, m)
