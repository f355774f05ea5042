"""GGUF quantised blocks of 32 -> the codes and scales of MatMulQ4 / Q5 / Q8 / Q4NL (via
``qweight.from_blocks``), with no rounding anywhere; the K-quants (Q4_K, Q5_K, Q6_K, Q3_K) have ops of their
own (``kquants.py``).

Every llama.cpp block format below is ``w = s * q + o`` per block: integer codes ``q``, a
float scale ``s`` and either a constant integer zero point (``o = -s * z``) or a float offset
``o``. MatMulQ4 / Q5 / Q8 hold ``d * q + m``: d = s and m = o (or -s * z). Every integer zero point here is
the middle of its codes' range, so those formats go to the centred ops (MatMulQ4S / Q5S / Q8S / Q4NLS), which
store d alone and form m = -z * d themselves (since op_version 13; before, m took as many bytes as d):

| GGUF | stored as                 | s                | o / z              |
|------|---------------------------|------------------|--------------------|
| Q4_0 | MatMulQ4S                 | d                | z = 8 (m = -8d)    |
| Q4_1 | MatMulQ4                  | d                | o = m              |
| Q5_0 | MatMulQ5S                 | d                | z = 16             |
| Q8_0 | MatMulQ8S (codes + 128)   | d                | z = 128            |
| Q5_1 | MatMulQ5                  | d                | o = m              |
| IQ4_NL | MatMulQ4NLS (kvalues + 128) | d           | z = 128            |
| IQ4_XS | MatMulQ4NLS (kvalues + 128) | d * (ls[j] - 32) | z = 128       |

The IQ4 formats' 4-bit codes index a table of 16 int8 values (``kvalues``, -127 ... 113): not a
linear grid, so they are unpacked here as 8-bit codes ``kvalue + 128`` (as Q8_0's) and stored by
MatMulQ4NLS as their 4-bit indices again, whose kernels look the 8-bit codes up (with d alone, 4.5 bits a
weight for IQ4_NL and 5 for IQ4_XS, whose d * (ls - 32) need fp32; the files hold 4.5 and 4.25). Every
product stays exact in float32: IQ4_XS's d (fp16, 11 bits) * (ls - 32) (at most 5) * a code (8).

``s`` and ``o`` are computed exactly as gguf's dequantiser computes them (float32 products), so
``s * q + o`` equals ``gguf.quants.dequantize`` bit for bit (tests/models/test_gguf_import.py).

The bit unpacking is gguf's own: a copy of the blocks with ``d = 1`` and ``m = 0`` dequantises to
``scale[j] * q`` (or ``q - z``), from which the codes follow exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .nbits import BLOCK_SIZE, QuantizedWeight, pack

ONE_HALF = np.array([1.0], np.float16).view(np.uint8)  # fp16 1.0's bytes: a block's d set to 1 to read its codes
_ZERO = np.array([0.0], np.float16).view(np.uint8)


@dataclass(frozen=True)
class BlockFormat:
    bits: int  # the width of the container gguf's codes are unpacked into (``nbits.QuantizedWeight``)
    code_bits: int  # the codes' own width: the format is held by MatMulQ{code_bits}
    zero_point: int  # every block's integer zero point (0 with float offsets)
    offsets: bool  # float block offsets o (Q4_1, Q5_1)
    header: tuple[int, ...]  # byte offsets of the fp16 fields set to (1, 0, ...) to read codes
    sub_scales: Callable[[np.ndarray], np.ndarray] | None = None  # IQ4_XS's per 32 columns
    nonlinear: bool = False  # IQ4: code_bits-wide indices of the codes ``kvalue + 128`` (MatMulQ4NL)


def _half(blocks: np.ndarray, at: int) -> np.ndarray:
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32)[:, 0]


def unscaled(values: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """sub-scale * code (``values`` [..., n, m], gguf's dequantiser with d = 1) divided by the sub-scales
    ``factor`` [..., n]: the codes, exactly; 0 where a sub-scale is 0 (its codes are lost, and any will do)."""
    safe = np.where(factor == 0, np.float32(1), factor)[..., None]
    return np.where(factor[..., None] == 0, 0, values / safe)


def iq4_xs_scales(blocks: np.ndarray) -> np.ndarray:
    """IQ4_XS: the 8 sub-block scales ls - 32 (6 bits: 4 low bits in bytes 4-7, 2 high bits in the
    uint16 at 2), as gguf's dequantiser unpacks them."""
    high = blocks[:, 2:4].copy().view(np.uint16)  # [n, 1]
    low = blocks[:, 4:8]
    j = np.arange(8)
    low_bits = (low[:, j // 2] >> (4 * (j % 2))) & 0x0F
    high_bits = (high >> (2 * j)).astype(np.uint8) & 0x03
    return (low_bits | (high_bits << 4)).astype(np.int8) - np.int8(32)


FORMATS: dict[str, BlockFormat] = {
    "Q4_0": BlockFormat(4, 4, 8, False, (0,)),
    "Q5_0": BlockFormat(8, 5, 16, False, (0,)),
    "Q8_0": BlockFormat(8, 8, 128, False, (0,)),
    "Q4_1": BlockFormat(4, 4, 0, True, (0, 2)),
    "Q5_1": BlockFormat(8, 5, 0, True, (0, 2)),
    "IQ4_NL": BlockFormat(8, 4, 128, False, (0,), nonlinear=True),
    "IQ4_XS": BlockFormat(8, 4, 128, False, (0,), iq4_xs_scales, nonlinear=True),
}


_ROWS = 4096  # rows per chunk: bounds the float temporaries of a large embedding


def import_blocks(raw: np.ndarray, qtype_name: str, rows: int, cols: int) -> QuantizedWeight:
    """A GGUF tensor's raw bytes (``rows`` rows of ``cols`` weights) as its exact codes and scales per block of
    32, in the nbits container (``qweight.from_blocks`` makes them a MatMulQ weight)."""
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    parts = [_import_rows(data[r : r + _ROWS], qtype_name, cols) for r in range(0, rows, _ROWS)]
    if len(parts) == 1:
        return parts[0]

    def join(field: str) -> np.ndarray | None:
        values = [getattr(p, field) for p in parts]
        return None if values[0] is None else np.concatenate(values)

    first = parts[0]
    return QuantizedWeight(
        join("packed"), join("scales"), join("zero_points"), first.bits, first.block_size, join("offsets")
    )


def _import_rows(data: np.ndarray, qtype_name: str, cols: int) -> QuantizedWeight:
    import gguf

    rows = data.shape[0]
    fmt = FORMATS[qtype_name]
    qtype = gguf.GGMLQuantizationType[qtype_name]
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    blocks = data.reshape(-1, size)  # [rows * cols / block, size]
    d = _half(blocks, fmt.header[0])
    unit = blocks.copy()
    unit[:, fmt.header[0] : fmt.header[0] + 2] = ONE_HALF
    for at in fmt.header[1:]:
        unit[:, at : at + 2] = _ZERO
    # q - z (symmetric formats) or scale[j] * (q - z) (IQ4_XS) or q (Q4_1 / Q5_1), exactly, per weight
    unpacked = gguf.quants.dequantize(unit.reshape(rows, -1), qtype).reshape(-1, block // BLOCK_SIZE, BLOCK_SIZE)

    offsets = np.repeat(_half(blocks, 2)[:, None], block // BLOCK_SIZE, axis=1) if fmt.offsets else None
    if fmt.sub_scales is None:
        scales = np.repeat(d[:, None], block // BLOCK_SIZE, axis=1)
        codes = unpacked + np.float32(fmt.zero_point)
    else:
        factor = fmt.sub_scales(blocks).astype(np.float32)
        codes = unscaled(unpacked, factor) + np.float32(fmt.zero_point)
        scales = d[:, None] * factor  # float32 products, as gguf's dequantiser forms them

    k_blocks = cols // BLOCK_SIZE
    codes = codes.astype(np.uint8).reshape(rows, k_blocks, BLOCK_SIZE)
    scales = np.ascontiguousarray(scales.reshape(rows, k_blocks), np.float32)
    zero_points = np.full((rows, k_blocks), fmt.zero_point, np.uint8)
    if offsets is not None:
        offsets = offsets.reshape(rows, k_blocks).astype(np.float32)
    return QuantizedWeight(
        packed=pack(codes, fmt.bits),
        scales=scales,
        zero_points=pack(zero_points, fmt.bits),
        bits=fmt.bits,
        block_size=BLOCK_SIZE,
        offsets=offsets,
    )
