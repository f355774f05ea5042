"""Block-wise weight quantisation for ``com.microsoft.MatMulNBits`` (8-bit linears, and the int8
LM head and embedding), one tensor at a time; 4-bit linears are ``q4.py``'s.

Every block holds ``block_size`` consecutive weights of one output row (along K) as integer codes
with a float scale and a uint8 zero point: ``w = scale * (code - zero_point)``, plus, for GGUF
formats with float block minimums (Q4_1, Q4_K, ...), a float ``offset`` per block that the graph
adds through the block sums of x (see ``gguf_blocks.py``). Weights from a GGUF file keep their
codes exactly (``gguf_blocks.import_blocks``); float weights are quantised here, by
onnxruntime's own C++ quantisers (``quantize_matmul_4bits`` / ``_8bits``, what
``MatMulNBitsQuantizer`` calls), so the packing is what the kernel expects.

``accuracy_level`` 4 makes the CPU kernel quantise activations to int8 and use VNNI.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK_SIZE = 32
ACCURACY_LEVEL = 4
BITS = {"int4": 4, "int8": 8}


@dataclass(frozen=True)
class QuantizedWeight:
    packed: np.ndarray  # uint8 [N, k_blocks, block_size * bits / 8]
    scales: np.ndarray  # float32 [N, k_blocks]
    zero_points: np.ndarray  # uint8 [N, ceil(k_blocks * bits / 8)]
    bits: int
    block_size: int = BLOCK_SIZE
    offsets: np.ndarray | None = None  # float32 [N, k_blocks]: w = scale * (code - zero) + offset

    @property
    def symmetric(self) -> bool:
        """Every zero point is the kernel's default (the code midpoint): the input can be left out."""
        return bool((self.unpacked_zero_points() == 1 << (self.bits - 1)).all())

    def unpacked_zero_points(self) -> np.ndarray:
        """uint8 [N, k_blocks]: one zero point per block."""
        k_blocks = self.scales.shape[1]
        if self.bits == 8:
            return self.zero_points[:, :k_blocks]
        both = np.stack([self.zero_points & 0x0F, self.zero_points >> 4], axis=-1)
        return np.ascontiguousarray(both.reshape(self.zero_points.shape[0], -1)[:, :k_blocks])

    def take_rows(self, order: np.ndarray) -> QuantizedWeight:
        """The weight with its output rows reordered (blocks run along K, so rows move whole)."""
        offsets = None if self.offsets is None else self.offsets[order]
        return QuantizedWeight(
            self.packed[order], self.scales[order], self.zero_points[order], self.bits, self.block_size, offsets
        )


_ROWS = 2048  # rows per chunk: bounds the float temporaries of a large embedding
SCALE_CANDIDATES = np.linspace(0.80, 1.04, 13, dtype=np.float32)  # x the min/max step
OFFSET_GAIN = 0.5  # float block offsets only where they halve the squared error


def quantize(weight: np.ndarray, bits: int, block_size: int = BLOCK_SIZE, offsets: bool = False) -> QuantizedWeight:
    """Quantise a float linear weight in [out, in] (N, K) layout along K, block by block, with the
    scale and integer zero point that minimise the block's squared error (a search over shrunk
    min/max steps, each refitted by least squares: llama.cpp's make_qkx2_quants idea), or with
    ``offsets``, as ``step * q + min`` with a float minimum (Q4_1's form; see ``prefers_offsets``)."""
    parts = [_quantize_rows(weight[r : r + _ROWS], bits, block_size, offsets) for r in range(0, len(weight), _ROWS)]
    return concat_rows(parts)


def prefers_offsets(rows: np.ndarray, bits: int, block_size: int = BLOCK_SIZE) -> bool:
    """Whether float block minimums fit these rows (a sample of a weight) much better than integer
    zero points: weights that sit on a ``min + step * q`` grid already, as dequantised Q4_1 or Q4_K
    blocks do, are kept on it; natural weights are not worth the extra Gemm."""

    def error(q: QuantizedWeight) -> float:
        return float(((dequantize(q, rows.shape[1]) - rows) ** 2).sum())

    return error(quantize(rows, bits, block_size, True)) < OFFSET_GAIN * error(quantize(rows, bits, block_size))


def _blocks(weight: np.ndarray, block_size: int) -> np.ndarray:
    n, k = weight.shape
    if k % block_size:
        weight = np.pad(weight, ((0, 0), (0, block_size - k % block_size)))
    return weight.reshape(n, -1, block_size).astype(np.float32)


def _quantize_rows(weight: np.ndarray, bits: int, block_size: int, offsets: bool) -> QuantizedWeight:
    blocks = _blocks(weight, block_size)
    levels = np.float32((1 << bits) - 1)
    if offsets:
        codes, scales, zero, shift = _on_min_grid(blocks, levels)
    else:
        codes, scales, zero = _searched(blocks, levels)
        shift = None
    n, k_blocks = scales.shape
    return QuantizedWeight(
        pack(codes.astype(np.uint8), bits),
        np.ascontiguousarray(scales, np.float32),
        pack(zero.astype(np.uint8).reshape(n, k_blocks), bits),
        bits,
        block_size,
        shift,
    )


def _codes(blocks: np.ndarray, scales: np.ndarray, zero: np.ndarray, levels: np.float32) -> np.ndarray:
    safe = np.where(scales == 0, np.float32(1), scales)
    return np.clip(np.rint(blocks / safe[..., None]) + zero[..., None], 0, levels)


def _searched(blocks: np.ndarray, levels: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per block, the best of the candidate steps: codes, scale, integer zero point."""
    lo, hi = np.minimum(blocks.min(-1), 0), np.maximum(blocks.max(-1), 0)
    span = (hi - lo) / levels
    best = (np.zeros(blocks.shape, np.float32), span, np.zeros(span.shape, np.float32))
    best_error = np.full(span.shape, np.inf, np.float32)
    for factor in SCALE_CANDIDATES:
        scale = span * factor
        zero = np.clip(np.rint(-lo / np.where(scale == 0, np.float32(1), scale)), 0, levels)
        codes = _codes(blocks, scale, zero, levels)
        centred = codes - zero[..., None]
        # least squares: the scale that fits these codes best
        denominator = (centred * centred).sum(-1)
        fitted = np.where(denominator > 0, (blocks * centred).sum(-1) / np.maximum(denominator, 1e-30), scale)
        error = ((blocks - fitted[..., None] * centred) ** 2).sum(-1)
        better = error < best_error
        best_error = np.where(better, error, best_error)
        best = (
            np.where(better[..., None], codes, best[0]),
            np.where(better, fitted, best[1]).astype(np.float32),
            np.where(better, zero, best[2]),
        )
    return best


def _on_min_grid(blocks: np.ndarray, levels: np.float32) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``min + step * q`` per block (exact for weights already on such a grid), as centred codes:
    w = step * (q - z) + offset with z the code nearest zero and offset = min + step * z."""
    lo, hi = blocks.min(-1), blocks.max(-1)
    scale = ((hi - lo) / levels).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = np.clip(np.rint((blocks - lo[..., None]) / safe[..., None]), 0, levels)
    zero = np.where(scale == 0, 0, np.clip(np.rint(-lo / safe), 0, levels)).astype(np.float32)
    return codes, scale, zero, (lo + scale * zero).astype(np.float32)


def compact_offsets(offsets: np.ndarray) -> np.ndarray:
    """Float block offsets as fp16 when fp16 holds every one exactly (Q4_1's and Q5_1's minimums are
    fp16 in the file), else as they are: AddBlockOffsets reads them once per decode step."""
    half = offsets.astype(np.float16)
    return half if np.array_equal(half.astype(np.float32), offsets) else offsets


def concat_rows(parts: list[QuantizedWeight]) -> QuantizedWeight:
    """Weights of one format stacked along N (the parts of a fused linear)."""
    if len(parts) == 1:
        return parts[0]
    offsets = None if parts[0].offsets is None else np.concatenate([p.offsets for p in parts])  # type: ignore[misc]
    return QuantizedWeight(
        np.concatenate([p.packed for p in parts]),
        np.concatenate([p.scales for p in parts]),
        np.concatenate([p.zero_points for p in parts]),
        parts[0].bits,
        parts[0].block_size,
        offsets,
    )


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., m] -> MatMulNBits bytes (4 bits: low nibble first)."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return np.ascontiguousarray(codes)
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (1,), np.uint8)], axis=-1)
    return np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4))


def dequantize(q: QuantizedWeight, k: int) -> np.ndarray:
    """The [N, K] float32 weight the graph computes with: ``scale * (code - zero) + offset``,
    in float32 and in that order (as gguf's dequantiser forms ``d * q + m``)."""
    n, k_blocks, _ = q.packed.shape
    if q.bits == 8:
        values = q.packed.reshape(n, k_blocks, q.block_size).astype(np.float32)
    else:
        low, high = q.packed & 0x0F, q.packed >> 4
        values = np.stack([low, high], axis=-1).reshape(n, k_blocks, q.block_size).astype(np.float32)
    weight = (values - q.unpacked_zero_points().astype(np.float32)[..., None]) * q.scales[..., None]
    if q.offsets is not None:
        weight = weight + q.offsets[..., None]
    return weight.reshape(n, -1)[:, :k]
