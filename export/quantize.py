"""Block-wise weight quantisation for ``com.microsoft.MatMulNBits``, one tensor at a time.

Every block holds 32 consecutive weights of one output row (along K). Three ways to fill it:

- **Weights already on a symmetric grid** (Q8_0 / Q4_0 blocks of a checkpoint dequantised from
  GGUF, ``d * q``) are kept *exactly*: codes q + 128 or q + 8, and no zero-point input (the
  kernel's default is that midpoint).
- **Q4_1 / Q4_K blocks** ``lo + d * q`` (q in 0..15, float ``lo``): codes q with scale d and the
  integer zero point z = round(-lo / d), which leaves a block-constant residual
  r = lo + d * z, |r| <= d / 2. Dropping r (plain re-rounding) costs SmolLM2-135M, a Q4_1 GGUF,
  a quarter of its top-1 agreement with fp32, because the error of a whole block moves with the
  block's activation sum. So the graph feeds MatMulNBits [x | block sums of x] and the weight
  gets the residuals as ceil(K/32/32) extra blocks (``append_residual_blocks``): r quantised to
  int4 there (error <= 1/30 of the row's largest step while blocks straddle zero) rides in the
  same kernel call, at +5 % bytes and three small nodes per linear input. SmolLM2 int4 agrees
  with fp32 on 96 % of top-1 tokens this way (92.8 % with the previous exact float-offset Gemm,
  which cost 4 nodes and 13 MB of fp32 per token; 70 % re-rounded); the integer zero point also
  keeps int8 activations' error smaller than codes 0..15 with the offset outside did.
  (MatMulNBits' float zero points would hold -lo / d exactly, but onnxruntime 1.31's CPU kernel
  then skips prepacking and dequantises the whole weight on every call: 35x slower at decode.)
- **Anything else**: round-to-nearest, asymmetric, by onnxruntime's own C++ quantisers
  (``quantize_matmul_4bits`` / ``_8bits``, what ``MatMulNBitsQuantizer`` calls), so the packing
  is what the kernel expects and a 135M model quantises in seconds. Asymmetric is as fast as
  symmetric on this CPU and more accurate.

``accuracy_level`` 4 makes the CPU kernel quantise activations to int8 and use VNNI.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK_SIZE = 32
ACCURACY_LEVEL = 4
BITS = {"int4": 4, "int8": 8}
_GRID_TOLERANCE = 1e-4  # of a block's step: GGUF dequantisation rounds in float32


@dataclass(frozen=True)
class QuantizedWeight:
    packed: np.ndarray  # uint8 [N, k_blocks, block_size * bits / 8]
    scales: np.ndarray  # float32 [N, k_blocks]
    zero_points: np.ndarray  # uint8 [N, ceil(k_blocks * bits / 8)]
    bits: int
    block_size: int = BLOCK_SIZE
    residual: np.ndarray | None = None  # float32 [N, k_blocks]: w = scale * (code - zero) + residual
    residual_blocks: int = 0  # trailing blocks that weigh the block sums of x (append_residual_blocks)

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


def quantize(weight: np.ndarray, bits: int, block_size: int = BLOCK_SIZE, symmetric: bool = False) -> QuantizedWeight:
    """Quantise a linear weight in [out, in] (N, K) layout along K: exactly if it already sits on
    a symmetric grid, else round-to-nearest, with integer zero points unless ``symmetric``."""
    exact = symmetric_grid(weight, bits, block_size) if symmetric_grid(weight[:8], bits, block_size) else None
    return exact if exact is not None else round_to_nearest(weight, bits, block_size, symmetric)


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
        zero_points = _pack(np.full(scales.shape, 1 << (bits - 1), np.uint8), bits)
    return QuantizedWeight(packed, scales, zero_points, bits, block_size)


def _blocks(weight: np.ndarray, block_size: int) -> np.ndarray:
    n, k = weight.shape
    if k % block_size:
        weight = np.pad(weight, ((0, 0), (0, block_size - k % block_size)))
    return weight.reshape(n, -1, block_size)


def _pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., m] -> MatMulNBits bytes (4 bits: low nibble first)."""
    codes = codes.astype(np.uint8)
    if bits == 8:
        return np.ascontiguousarray(codes)
    if codes.shape[-1] % 2:
        codes = np.concatenate([codes, np.zeros(codes.shape[:-1] + (1,), np.uint8)], axis=-1)
    return np.ascontiguousarray(codes[..., 0::2] | (codes[..., 1::2] << 4))


_ROWS = 4096  # rows per chunk: bounds the float temporaries of a large embedding


def _by_rows(fn, weight: np.ndarray, bits: int, block_size: int) -> QuantizedWeight | None:
    parts = [fn(weight[r : r + _ROWS], bits, block_size) for r in range(0, weight.shape[0], _ROWS)]
    if any(p is None for p in parts):
        return None

    def join(field: str) -> np.ndarray | None:
        return None if getattr(parts[0], field) is None else np.concatenate([getattr(p, field) for p in parts])

    return QuantizedWeight(join("packed"), join("scales"), join("zero_points"), bits, block_size, join("residual"))


def symmetric_grid(weight: np.ndarray, bits: int, block_size: int = BLOCK_SIZE) -> QuantizedWeight | None:
    """Blocks that are ``d * q`` with q in [-2^(b-1), 2^(b-1) - 1] (Q8_0, Q4_0), or None."""
    return _by_rows(_symmetric_grid, weight, bits, block_size)


def _symmetric_grid(weight: np.ndarray, bits: int, block_size: int) -> QuantizedWeight | None:
    blocks = _blocks(weight, block_size)
    half = 1 << (bits - 1)
    peak = np.abs(blocks).max(-1)
    # the largest |w| is code -half (positive scale) or, as Q4_0 writes it, code +half of a
    # negative scale; Q8_0 scales by 127, so try both divisors.
    for divisor in (half, half - 1):
        step = np.where(peak > 0, peak / divisor, 1.0).astype(np.float32)
        top = blocks.max(-1) >= -blocks.min(-1)  # the largest magnitude is positive
        scales = np.where(top & (divisor == half), -step, step).astype(np.float32)
        codes = np.round(blocks / scales[..., None])
        if codes.min() < -half or codes.max() > half - 1:
            continue
        if np.abs(codes * scales[..., None] - blocks).max() <= _GRID_TOLERANCE * step.max():
            zero = np.full(scales.shape, half, np.uint8)
            return QuantizedWeight(_pack(codes + half, bits), scales, _pack(zero, bits), bits, block_size)
    return None


def offset_grid(weight: np.ndarray, bits: int, block_size: int = BLOCK_SIZE) -> QuantizedWeight:
    """``lo + d * q`` blocks as codes q, scale d, integer zero point round(-lo / d) and the
    block-constant ``residual`` lo + d * zero: exact for Q4_1 / Q4_K-dequantised weights
    (round-to-nearest with an unrounded minimum for any others)."""
    return _by_rows(_offset_grid, weight, bits, block_size)


def _offset_grid(weight: np.ndarray, bits: int, block_size: int) -> QuantizedWeight:
    blocks = _blocks(weight, block_size)
    levels = (1 << bits) - 1
    lo, hi = blocks.min(-1), blocks.max(-1)
    scales = np.where(hi > lo, (hi - lo) / levels, 1.0).astype(np.float32)
    codes = np.clip(np.round((blocks - lo[..., None]) / scales[..., None]), 0, levels)
    zero = np.clip(np.round(-lo / scales), 0, levels)
    residual = (lo + scales * zero).astype(np.float32)
    return QuantizedWeight(_pack(codes, bits), scales, _pack(zero, bits), bits, block_size, residual)


def append_residual_blocks(q: QuantizedWeight) -> QuantizedWeight:
    """The weight MatMulNBits needs over [x | block sums of x] (K + k_blocks columns): q's blocks,
    then its residuals, one per block sum, quantised to int4 like any weight."""
    if q.bits != 4:
        raise ValueError("residual blocks are 4-bit")
    r = round_to_nearest(q.residual, 4, q.block_size)
    zero = np.concatenate([q.unpacked_zero_points(), r.unpacked_zero_points()], axis=1)
    return QuantizedWeight(
        np.concatenate([q.packed, r.packed], axis=1),
        np.concatenate([q.scales, r.scales], axis=1),
        _pack(zero, 4),
        4,
        q.block_size,
        residual_blocks=r.scales.shape[1],
    )


def on_offset_grid(rows: np.ndarray, bits: int = 4, block_size: int = BLOCK_SIZE) -> bool:
    """Whether sampled rows sit exactly on ``lo + d * q`` grids but not on symmetric ones."""
    if symmetric_grid(rows, bits, block_size) is not None:
        return False
    q = offset_grid(rows, bits, block_size)
    return bool(np.abs(dequantize(q, rows.shape[1]) - rows).max() <= _GRID_TOLERANCE * q.scales.max())


def dequantize(q: QuantizedWeight, k: int) -> np.ndarray:
    """The [N, K] float32 weight the graph computes with: MatMulNBits' blocks plus the residual,
    exact or (``residual_blocks``) as the extra blocks hold it."""
    n, k_blocks, _ = q.packed.shape
    if q.bits == 8:
        values = q.packed.reshape(n, k_blocks, q.block_size).astype(np.float32)
    else:
        low, high = q.packed & 0x0F, q.packed >> 4
        values = np.stack([low, high], axis=-1).reshape(n, k_blocks, q.block_size).astype(np.float32)
    weight = (values - q.unpacked_zero_points().astype(np.float32)[..., None]) * q.scales[..., None]
    weight = weight.reshape(n, -1)
    if q.residual_blocks:
        main = k_blocks - q.residual_blocks
        residual = weight[:, main * q.block_size :][:, :main]  # coefficient of block b's sum
        weight = weight[:, : main * q.block_size] + np.repeat(residual, q.block_size, axis=1)
    elif q.residual is not None:
        weight = weight + np.repeat(q.residual, q.block_size, axis=1)
    return weight[:, :k]
