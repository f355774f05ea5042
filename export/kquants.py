"""GGUF's K-quants, held exactly at their own widths: Q4_K and Q5_K for ``ortserve.MatMulQ4K`` / ``MatMulQ5K``
(``w = d * sc * q - dmin * mn``: 4- or 5-bit codes q, a 6-bit sub-scale sc and min mn per row and 32 columns,
fp16 d and dmin per row and 256, llama.cpp's super-block), the "sub16" Q6_K and Q3_K for ``ortserve.MatMulQ6K``
/ ``MatMulQ3K`` (``w = d * sc * (q - middle)``: 6- or 3-bit codes, middle 32 or 4, an int8 sc per row and 16
columns, an fp16 d per row and 256), and Q2_K for ``ortserve.MatMulQ2K`` (``w = d * sc * q - dmin * mn``: 2-bit
codes, a 4-bit sc and mn per row and 16 columns, fp16 d and dmin per row and 256). The ops' layouts hold 4.625,
5.625, 6.5625, 3.5625 and 2.625 bits a weight against the file's 4.5, 5.5, 6.5625, 3.4375 and 2.625 (Q4_K's, Q5_K's
and Q3_K's 6-bit sub-scales take a byte each); their numpy references are ``pack_qk`` / ``pack_sub16`` /
``pack_q2k`` in ``contrib_ops``. IQ4_XS, not a K-quant but of their super-block, is held the same
way by ``ortserve.MatMulQ4XS`` (``pack_q4xs``: MatMulQ4NL's 4-bit indices of IQ4's values, an int8 ls - 32 per row
and 32 columns, an fp16 d per row and 256: 4.3125 bits a weight against the file's 4.25).

The codes are read as gguf's own dequantiser reads them: a copy of the blocks with d = 1 (and dmin = 0)
dequantises to sc * q (sub16: sc * (q - middle)), and dividing by sc gives the codes exactly (a sub-block of
sc = 0 holds zeros whatever its codes: any do). Q3_K's packed 6-bit sc are read the same way, from a copy whose
codes are all 0 too (q - 4 = -4); Q2_K's sc and mn are the low and high nibbles of its first 16 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TypeVar

import numpy as np
from ortserve.ops.matmul_q_reference import (
    SUB16_MIDDLE,
    dequantize_q,
    dequantize_sub16,
    pack_q2k,
    pack_q4xs,
    pack_qk,
    pack_sub16,
)

from .gguf_blocks import ONE_HALF, import_blocks, iq4_xs_scales, unscaled
from .nbits import CodeLayout
from .qweight import from_blocks

_ROWS = 4096  # rows per chunk: bounds the float temporaries of a large embedding
QK_FORMATS = {"Q4_K": 4, "Q5_K": 5}  # GGUF type -> its codes' width
SUB16_FORMATS = {"Q6_K": 6, "Q3_K": 3, "Q2_K": 2}
# GGUF type -> the op that holds it at its own width: MatMulQ{bits}{variant}
LAYOUTS = {
    **{qtype: CodeLayout(bits, "K") for qtype, bits in {**QK_FORMATS, **SUB16_FORMATS}.items()},
    "IQ4_XS": CodeLayout(4, "XS"),
}
_IQ4XS_BYTES = 136
_Q6K_BYTES, _Q6K_SCALES_AT, _Q6K_D_AT = 210, 192, 208  # a Q6_K block of 256 weights: its bytes, scales, d
_Q3K_BYTES, _Q3K_CODE_BYTES, _Q3K_D_AT = 110, 96, 108  # a Q3_K block: its bytes, high bits + low bits, d
_Q2K_BYTES, _Q2K_D_AT, _Q2K_DMIN_AT = 84, 80, 82  # a Q2_K block: its bytes (16 of sc | mn << 4, 64 of codes), d, dmin


class _RowMajor:
    """A weight whose array fields all run along N, its output rows."""

    def take_rows(self, order: np.ndarray):  # -> Self
        """The weight with its output rows reordered."""
        return replace(self, **{f.name: getattr(self, f.name)[order] for f in _arrays(self)})  # type: ignore[type-var]

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape  # type: ignore[attr-defined,no-any-return]


@dataclass(frozen=True)
class QKWeight(_RowMajor):
    codes: np.ndarray  # uint8 [N, K], 0..2^bits - 1
    sub_scales: np.ndarray  # uint8 [N, K / 32], 0..63
    mins: np.ndarray  # uint8 [N, K / 32], 0..63
    d: np.ndarray  # float32 [N, K / 256], fp16 values
    dmin: np.ndarray  # float32 [N, K / 256], fp16 values
    bits: int  # 4 (Q4_K) or 5 (Q5_K)

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes [G, KB, 288 | 352], scales fp16 [G, KB / 8, 2, 16]) as MatMulQ4K / Q5K read them."""
        return pack_qk(self.codes, self.sub_scales, self.mins, self.d, self.dmin, self.bits, np.float16)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32: (d * sc) * q - dmin * mn, as gguf forms it."""
        return dequantize_q(*self.packed(), *self.shape)


@dataclass(frozen=True)
class Sub16Weight(_RowMajor):
    codes: np.ndarray  # uint8 [N, K], 0..2^bits - 1
    sub_scales: np.ndarray  # int8 [N, K / 16]
    d: np.ndarray  # float32 [N, K / 256], fp16 values
    bits: int  # 6 (Q6_K) or 3 (Q3_K)

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes [G, KB, 416 | 224], scales fp16 [G, KB / 8, 16]) as MatMulQ6K / Q3K read them."""
        return pack_sub16(self.codes, self.sub_scales, self.d, self.bits, np.float16)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32: (d * sc) * (q - middle), as gguf forms it."""
        return dequantize_sub16(*self.packed(), *self.shape)


@dataclass(frozen=True)
class Q4XSWeight(_RowMajor):
    codes: np.ndarray  # uint8 [N, K]: indices 0..15 of IQ4's values
    sub_scales: np.ndarray  # int8 [N, K / 32]: ls - 32
    d: np.ndarray  # float32 [N, K / 256], fp16 values

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes [G, KB, 272], scales fp16 [G, KB / 8, 16]) as MatMulQ4XS reads them."""
        return pack_q4xs(self.codes, self.sub_scales, self.d, np.float16)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32: d * (ls - 32) * kvalue, as gguf forms it."""
        return dequantize_q(*self.packed(), *self.shape)


@dataclass(frozen=True)
class Q2KWeight(_RowMajor):
    codes: np.ndarray  # uint8 [N, K], 0..3
    sub_scales: np.ndarray  # uint8 [N, K / 16], 0..15
    d: np.ndarray  # float32 [N, K / 256], fp16 values
    mins: np.ndarray  # uint8 [N, K / 16], 0..15
    dmin: np.ndarray  # float32 [N, K / 256], fp16 values

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes [G, KB, 160], scales fp16 [G, KB / 8, 2, 16]) as MatMulQ2K reads them."""
        return pack_q2k(self.codes, self.sub_scales, self.mins, self.d, self.dmin, np.float16)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32: (d * sc) * q - dmin * mn, as gguf forms it."""
        return dequantize_sub16(*self.packed(), *self.shape)


KQuantWeight = QKWeight | Sub16Weight | Q4XSWeight | Q2KWeight
W = TypeVar("W", QKWeight, Sub16Weight, Q4XSWeight, Q2KWeight)


def _arrays(weight: object) -> list:
    return [f for f in fields(weight) if isinstance(getattr(weight, f.name), np.ndarray)]  # type: ignore[arg-type]


def concat_kquant(parts: list[W]) -> W:
    """The parts of a fused linear stacked along N (all of one format and width)."""
    if len(parts) == 1:
        return parts[0]
    return replace(parts[0], **{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in _arrays(parts[0])})


def import_kquant(raw: np.ndarray, qtype_name: str, rows: int, cols: int) -> KQuantWeight:
    """A Q4_K, Q5_K, Q6_K, Q3_K, Q2_K or IQ4_XS tensor's raw bytes (``rows`` rows of ``cols`` weights) as its codes
    and scales, exactly."""
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    read = {"Q6_K": _q6k_rows, "Q3_K": _q3k_rows, "Q2_K": _q2k_rows, "IQ4_XS": _iq4xs_rows}.get(qtype_name, _qk_rows)
    return concat_kquant([read(data[r : r + _ROWS], qtype_name, cols) for r in range(0, rows, _ROWS)])  # type: ignore[type-var]


def _half(blocks: np.ndarray, at: int, rows: int) -> np.ndarray:
    """The fp16 field at byte ``at`` of every block, float32 [rows, blocks a row]."""
    return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32).reshape(rows, -1)


def _dequantized_with_unit_scale(
    blocks: np.ndarray, qtype_name: str, rows: int, d_at: int, dmin_at: int | None
) -> np.ndarray:
    """gguf's dequantisation of a copy of the blocks with d = 1 (and dmin = 0): sc * q, or sc * (q - 32)."""
    import gguf

    unit = blocks.copy()
    unit[:, d_at : d_at + 2] = ONE_HALF
    if dmin_at is not None:
        unit[:, dmin_at : dmin_at + 2] = 0
    return gguf.quants.dequantize(unit.reshape(rows, -1), gguf.GGMLQuantizationType[qtype_name])


def _qk_rows(data: np.ndarray, qtype_name: str, cols: int) -> QKWeight:
    """Q4_K / Q5_K: d (bytes 0-1), dmin (2-3), 12 bytes of 6-bit sub-scales and mins (unpacked by gguf), codes."""
    from gguf.quants import Q4_K

    rows = data.shape[0]
    blocks = data.reshape(rows * cols // 256, -1)
    sub_scales, mins = (a.reshape(rows, -1) for a in Q4_K.get_scale_min(blocks[:, 4:16]))
    scaled = _dequantized_with_unit_scale(blocks, qtype_name, rows, 0, 2).reshape(rows, -1, 32)
    codes = unscaled(scaled, sub_scales.astype(np.float32)).astype(np.uint8).reshape(rows, cols)
    fields_ = (sub_scales, mins, _half(blocks, 0, rows), _half(blocks, 2, rows))
    return QKWeight(codes, *(np.ascontiguousarray(f) for f in fields_), QK_FORMATS[qtype_name])


def _q6k_rows(data: np.ndarray, qtype_name: str, cols: int) -> Sub16Weight:
    """Q6_K: 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 sub-scales, d."""
    blocks = data.reshape(-1, _Q6K_BYTES)
    sub_scales = blocks[:, _Q6K_SCALES_AT:_Q6K_D_AT].view(np.int8).reshape(data.shape[0], -1)
    return _sub16_rows(blocks, qtype_name, cols, sub_scales, _Q6K_D_AT)


def _q3k_rows(data: np.ndarray, qtype_name: str, cols: int) -> Sub16Weight:
    """Q3_K: 32 bytes of high bits, 64 of low bit pairs, 12 bytes of 6-bit sub-scales (unpacked by gguf: with every
    code 0 and d = 1 a sub-block dequantises to -4 * sc), d."""
    rows = data.shape[0]
    blocks = data.reshape(-1, _Q3K_BYTES)
    lowest = blocks.copy()
    lowest[:, :_Q3K_CODE_BYTES] = 0
    per_16 = _dequantized_with_unit_scale(lowest, qtype_name, rows, _Q3K_D_AT, None).reshape(rows, -1, 16)[..., 0]
    sub_scales = (per_16 / -SUB16_MIDDLE[3]).astype(np.int8)
    return _sub16_rows(blocks, qtype_name, cols, sub_scales, _Q3K_D_AT)


def _q2k_rows(data: np.ndarray, qtype_name: str, cols: int) -> Q2KWeight:
    """Q2_K: 16 bytes of sc | mn << 4, 64 of 2-bit codes, d, dmin; the codes from gguf's sc * q with d = 1, dmin = 0."""
    rows = data.shape[0]
    blocks = data.reshape(-1, _Q2K_BYTES)
    packed_scales = blocks[:, :16].reshape(rows, -1)
    sub_scales, mins = packed_scales & 15, packed_scales >> 4
    scaled = _dequantized_with_unit_scale(blocks, qtype_name, rows, _Q2K_D_AT, _Q2K_DMIN_AT).reshape(rows, -1, 16)
    codes = unscaled(scaled, sub_scales.astype(np.float32)).astype(np.uint8).reshape(rows, cols)
    fields_ = (sub_scales, _half(blocks, _Q2K_D_AT, rows), mins, _half(blocks, _Q2K_DMIN_AT, rows))
    return Q2KWeight(codes, *(np.ascontiguousarray(f) for f in fields_))


def _iq4xs_rows(data: np.ndarray, qtype_name: str, cols: int) -> Q4XSWeight:
    """IQ4_XS: d (bytes 0-1), the 6-bit ls (bytes 2-7), the 4-bit indices: read per block of 32 by ``gguf_blocks``
    (gguf's dequantiser), then held as indices, ls - 32 and d."""
    rows = data.shape[0]
    blocks = data.reshape(-1, _IQ4XS_BYTES)
    indices = from_blocks(import_blocks(data, qtype_name, rows, cols), cols, 4, nonlinear=True).codes
    sub_scales = iq4_xs_scales(blocks).reshape(rows, -1)
    return Q4XSWeight(indices, np.ascontiguousarray(sub_scales), _half(blocks, 0, rows))


def _sub16_rows(blocks: np.ndarray, qtype_name: str, cols: int, sub_scales: np.ndarray, d_at: int) -> Sub16Weight:
    """A sub16 tensor's codes from gguf's sc * (q - middle) of its blocks with d = 1."""
    rows, bits = sub_scales.shape[0], SUB16_FORMATS[qtype_name]
    scaled = _dequantized_with_unit_scale(blocks, qtype_name, rows, d_at, None)
    signed = unscaled(scaled.reshape(rows, -1, 16), sub_scales.astype(np.float32))
    codes = (signed + SUB16_MIDDLE[bits]).astype(np.uint8).reshape(rows, cols)
    return Sub16Weight(codes, np.ascontiguousarray(sub_scales), _half(blocks, d_at, rows), bits)
