"""Quantised codes in ``com.microsoft.MatMulNBits``'s packing: ``w = scale * (code - zero_point)`` per block
of ``block_size`` weights of one output row (along K), plus, for formats with float block minimums
(Q4_1, Q4_K, ...), a float ``offset`` per block. ``gguf_blocks.import_blocks`` and ``hf_quantized`` unpack
every exact format with blocks of 32 into this container, which then becomes a MatMulQ4 / Q5 / Q8 / Q4NL
weight (``qweight.from_blocks``); GGUF's K-quants have their own (``kquants.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK_SIZE = 32
BITS = {"int4": 4, "int5": 5, "int8": 8}


@dataclass(frozen=True)
class CodeLayout:
    """How a source tensor's own codes are held exactly: MatMulQ{bits}{variant} (variant "NL": MatMulQ4NL, 4-bit
    indices of GGUF's IQ4 values; "S": centred codes, m = -middle * d, not stored; "K": MatMulQ4K / Q5K / Q6K,
    GGUF's K-quants, ``kquants.py``)."""

    bits: int
    variant: str = ""


SCALE_CANDIDATES = np.linspace(0.80, 1.04, 13, dtype=np.float32)  # x the min/max step (qweight's search)
WIDE_SCALE_CANDIDATES = np.linspace(0.70, 1.04, 25, dtype=np.float32)  # the same, with calibration


@dataclass(frozen=True)
class QuantizedWeight:
    packed: np.ndarray  # uint8 [N, k_blocks, block_size * bits / 8]
    scales: np.ndarray  # float32 [N, k_blocks]
    zero_points: np.ndarray  # uint8 [N, ceil(k_blocks * bits / 8)]
    bits: int
    block_size: int = BLOCK_SIZE
    offsets: np.ndarray | None = None  # float32 [N, k_blocks]: w = scale * (code - zero) + offset

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
