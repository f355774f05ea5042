"""Block-wise weight quantisation for ``com.microsoft.MatMulNBits``, one tensor at a time.

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


def quantize(weight: np.ndarray, bits: int, block_size: int = BLOCK_SIZE) -> QuantizedWeight:
    """Quantise a float linear weight in [out, in] (N, K) layout along K."""
    return round_to_nearest(weight, bits, block_size)


def round_to_nearest(
    weight: np.ndarray, bits: int, block_size: int = BLOCK_SIZE, symmetric: bool = False
) -> QuantizedWeight:
    """ORT's quantiser: asymmetric, or ``symmetric`` (zero point = the code midpoint, left out
    of the graph)."""
    from onnxruntime.capi._pybind_state import (
        quantize_matmul_4bits,
        quantize_matmul_8bits,
    )

    n, k = weight.shape
    k_blocks = -(-k // block_size)
    kmajor = np.zeros((k_blocks * block_size, n), np.float32)  # the quantiser reads the MatMul layout [K, N]
    kmajor[:k] = weight.T
    packed = np.zeros((n, k_blocks, block_size * bits // 8), np.uint8)
    scales = np.zeros((n, k_blocks), np.float32)
    zero_points = np.zeros((n, -(-k_blocks * bits // 8)), np.uint8)
    quantizer = {4: quantize_matmul_4bits, 8: quantize_matmul_8bits}[bits]
    quantizer(packed, kmajor, scales, zero_points, block_size, n, k_blocks * block_size, symmetric)
    if symmetric:  # the quantiser leaves them untouched: the kernel's default is the midpoint
        zero_points = pack(np.full(scales.shape, 1 << (bits - 1), np.uint8), bits)
    return QuantizedWeight(packed, scales, zero_points, bits, block_size)


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
