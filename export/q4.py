"""4-bit weights for ``ortserve.MatMulQ4``: ``w = d * q + m`` per row and block of 32 columns, codes
q in 0..15 and a float scale d and minimum m per block (llama.cpp's Q4_1 form).

Every 4-bit GGUF format is this form exactly (``from_blocks``: Q4_0 has m = -8d, Q4_1 its d and m,
Q4_K d * scale[j] and -dmin * min[j]); float weights are quantised here (``quantize_q4``) with d and m
that fp16 holds, searched per block for the least squared error. The scales are stored as fp16 when
fp16 holds every d and m exactly, else as fp32 (Q4_K's products). The op's layout and its numpy
reference are in ``contrib_ops`` (``pack_q4``, ``matmul_q4``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ortserve.ops.paged_attention_reference import Q4_BLOCK, pack_q4

from .quantize import SCALE_CANDIDATES, QuantizedWeight

_ROWS = 2048  # rows per chunk: bounds the float temporaries of a large embedding
LEVELS = np.float32(15)


@dataclass(frozen=True)
class Q4Weight:
    codes: np.ndarray  # uint8 [N, K], 0..15
    d: np.ndarray  # float32 [N, ceil(K / 32)]
    m: np.ndarray  # float32 [N, ceil(K / 32)]

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes [G, KB, 256], scales [G, KB, 2, 16]) as MatMulQ4 reads them."""
        exact = all(np.array_equal(a.astype(np.float16).astype(np.float32), a) for a in (self.d, self.m))
        return pack_q4(self.codes, self.d, self.m, np.float16 if exact else np.float32)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32: d * q + m, in float32 and in that order (as gguf forms ``d * q + m``)."""
        blocks = np.arange(self.codes.shape[1]) // Q4_BLOCK
        return self.codes.astype(np.float32) * self.d[:, blocks] + self.m[:, blocks]


def concat_q4(parts: list[Q4Weight]) -> Q4Weight:
    """The parts of a fused linear stacked along N."""
    if len(parts) == 1:
        return parts[0]
    return Q4Weight(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("codes", "d", "m")))


def from_blocks(q: QuantizedWeight, k: int) -> Q4Weight:
    """A GGUF tensor's 4-bit codes (``gguf_blocks.import_blocks``): m = offset - d * z, exactly (z * d
    is exact, and the difference is the format's own m)."""
    assert q.bits == 4 and q.block_size == Q4_BLOCK, (q.bits, q.block_size)
    n, k_blocks, _ = q.packed.shape
    codes = np.stack([q.packed & 0x0F, q.packed >> 4], axis=-1).reshape(n, k_blocks * Q4_BLOCK)[:, :k]
    zero = q.unpacked_zero_points().astype(np.float32)
    m = -(q.scales * zero) if q.offsets is None else q.offsets - q.scales * zero
    return Q4Weight(np.ascontiguousarray(codes), q.scales, np.ascontiguousarray(m, np.float32))


def quantize_q4(weight: np.ndarray) -> Q4Weight:
    """Float [N, K] weights: per block, the best of steps (max - min) / 15 shrunk by the candidate
    factors, each with its codes refitted by least squares to (d, m) and rounded to fp16 (llama.cpp's
    make_qkx2_quants idea); weights already on such a grid (dequantised Q4_1) come back exactly."""
    parts = [_quantize_rows(weight[r : r + _ROWS]) for r in range(0, len(weight), _ROWS)]
    return concat_q4(parts)


def _half(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float16).astype(np.float32)


def _quantize_rows(weight: np.ndarray) -> Q4Weight:
    n, k = weight.shape
    padded = np.pad(weight.astype(np.float32), ((0, 0), (0, -k % Q4_BLOCK)), mode="edge")
    blocks = padded.reshape(n, -1, Q4_BLOCK)
    lo, hi = blocks.min(-1), blocks.max(-1)
    best_error = np.full(lo.shape, np.inf, np.float32)
    best = (np.zeros(blocks.shape, np.float32), np.zeros(lo.shape, np.float32), _half(lo))
    for factor in SCALE_CANDIDATES:
        step = (hi - lo) / LEVELS * factor
        safe = np.where(step > 0, step, np.float32(1))
        codes = np.clip(np.rint((blocks - lo[..., None]) / safe[..., None]), 0, LEVELS)
        for d, m in (_fit(blocks, codes), (_half(step), _half(lo))):
            error = ((d[..., None] * codes + m[..., None] - blocks) ** 2).sum(-1)
            better = error < best_error
            best_error = np.where(better, error, best_error)
            best = (np.where(better[..., None], codes, best[0]), np.where(better, d, best[1]), np.where(better, m, best[2]))
    codes, d, m = best
    codes = codes.reshape(n, -1)[:, :k].astype(np.uint8)
    return Q4Weight(np.ascontiguousarray(codes), d.astype(np.float32), m.astype(np.float32))


def _fit(blocks: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares (d, m) of w ~ d * q + m per block, rounded to fp16."""
    q_mean, w_mean = codes.mean(-1), blocks.mean(-1)
    q_centred = codes - q_mean[..., None]
    variance = (q_centred * q_centred).sum(-1)
    d = np.where(variance > 0, (q_centred * blocks).sum(-1) / np.maximum(variance, 1e-30), 0).astype(np.float32)
    d = _half(d)
    return d, _half(w_mean - d * q_mean)
