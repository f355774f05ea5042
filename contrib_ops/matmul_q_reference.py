"""Numpy references of ortserve's quantised linears and lookups (domain ``ortserve``): MatMulQ4 / Q5 / Q8 / Q4NL,
their centred forms (Q4S / Q5S / Q8S / Q4NLS), MatMulQ4XS, MatMulQ4K / Q5K, the sub16 MatMulQ2K / Q3K / Q6K and the
GatherQ of each, with their weight layouts (``pack_q``, ``pack_q4xs``, ``pack_qk``, ``pack_sub16``, ``pack_q2k``) and
the activations' quantisation (``quantize_activations``).

This file is the specification: the C++ ops in ``contrib_ops/`` (``matmul_q_kernel.h`` has the layouts) must match it.
"""

from __future__ import annotations

import numpy as np

Q_BLOCK, Q_GROUP = 32, 16  # MatMulQ4 / MatMulQ8: columns per block (one d, m each), weight rows per group
Q_BLOCK_BYTES = {4: 256, 5: 320, 8: 512}
# MatMulQ4NL / GatherQ4NL: the 4-bit layout, whose codes index these 8-bit codes (GGUF's IQ4_NL values + 128)
Q4NL_CODES = np.array([1, 24, 45, 63, 79, 93, 106, 118, 129, 141, 153, 166, 181, 197, 217, 241], np.uint8)
RESIDUAL_STEPS = np.float32(256)  # 16-bit activations: the residual row's grid is 256 times finer


def pack_q(codes, d, m, bits=4, scale_dtype=np.float16):
    """MatMulQ4's, MatMulQ5's or MatMulQ8's weight layout (contrib_ops/matmul_q_kernel.h) of
    W = d * q + m per row and block of 32 columns: codes uint8 [N, K] (0..2^bits - 1), d and m
    [N, ceil(K / 32)] -> (packed uint8 [G, KB, 256, 320 or 512], scales [G, KB, 2, 16] of scale_dtype).
    ``m`` None: the centred layout (MatMulQ4S / Q5S / Q8S / Q4NLS), m = -middle * d (``q_middle``), scales
    [G, KB, 16] of d alone.
    Rows are padded to whole groups of 16 and columns to whole blocks with q = d = m = 0. Byte c * 64 +
    r * 4 + j of a block holds q[16g + r, 32b + 4c + j] (8 bits; 4 and 5 bits: c < 4 in the low nibble,
    and q[16g + r, 32b + 16 + 4c + j] in the high one; 5 bits: then the fifth bits, bit i % 8 of byte
    256 + 8c + i / 8 for lane i = 4r + j of column group c < 8)."""
    codes = np.asarray(codes, np.uint8)
    n, k = codes.shape
    groups, k_blocks = -(-n // Q_GROUP), -(-k // Q_BLOCK)
    full = np.zeros((groups * Q_GROUP, k_blocks * Q_BLOCK), np.uint8)
    full[:n, :k] = codes
    q = full.reshape(groups, Q_GROUP, k_blocks, 8, 4).transpose(0, 2, 3, 1, 4)  # [G, KB, c, r, j]
    if bits == 8:
        packed = q
    else:
        low = q & 0x0F
        packed = (low[:, :, :4] | (low[:, :, 4:] << 4)).reshape(groups, k_blocks, -1)
        if bits == 5:
            fifth = np.packbits((q >> 4).reshape(groups, k_blocks, 8, 64), axis=-1, bitorder="little")
            packed = np.concatenate([packed, fifth.reshape(groups, k_blocks, 64)], axis=-1)
    vectors = 1 if m is None else 2
    scales = np.zeros((groups * Q_GROUP, k_blocks, vectors), np.float32)
    scales[:n, :, 0] = d
    if m is not None:
        scales[:n, :, 1] = m
    scales = scales.reshape(groups, Q_GROUP, k_blocks, vectors).transpose(0, 2, 3, 1)
    if m is None:
        scales = scales[:, :, 0]
    packed = packed.reshape(groups, k_blocks, Q_BLOCK_BYTES[bits])
    return np.ascontiguousarray(packed), np.ascontiguousarray(scales.astype(scale_dtype))


def q_middle(width, nonlinear=False):
    """A centred layout's middle code (m = -middle * d), by its block's bytes: 8 (MatMulQ4S), 16 (Q5S), 128 (Q8S,
    Q4NLS: the 8-bit codes, 128 + GGUF's IQ4 values)."""
    return np.float32(128 if nonlinear else {Q_BLOCK_BYTES[4]: 8, Q_BLOCK_BYTES[5]: 16, Q_BLOCK_BYTES[8]: 128}[width])


def unpack_q(packed, scales, n, k, nonlinear=False):
    """pack_q's inverse: (codes uint8 [N, K], d float32 [N, KB], m float32 [N, KB]); ``nonlinear``
    (MatMulQ4NL): the 4-bit codes looked up in Q4NL_CODES. A MatMulQ4K / Q5K weight (``pack_qk``) gives its
    blocks' d * sc and -dmin * mn as d and m (float32 products, exact); a centred one, scales [G, KB, 16],
    m = -middle * d; a MatMulQ4XS one (``pack_q4xs``) its 8-bit codes, d * sc and -128 times that."""
    groups, k_blocks, width = packed.shape
    packed = np.asarray(packed, np.uint8)
    super_block = np.arange(k_blocks) // Q_SUPER_BLOCKS
    if width in QK_BLOCK_BYTES.values():
        codes, sub_scales, mins, d, dmin = unpack_qk(packed, scales, n, k)
        return codes, d[:, super_block] * sub_scales, -dmin[:, super_block] * mins
    if width == Q4XS_BLOCK_BYTES:
        indices, sub_scales, d = unpack_q4xs(packed, scales, n, k)
        block_d = d[:, super_block] * sub_scales
        return Q4NL_CODES[indices], block_d, np.float32(-128) * block_d
    nibbles = width != Q_BLOCK_BYTES[8]
    low = packed[..., : Q_BLOCK_BYTES[4] if nibbles else width]
    q = low.reshape(groups, k_blocks, -1, Q_GROUP, 4)  # [G, KB, c, r, j]
    if nibbles:
        q = np.concatenate([q & 0x0F, q >> 4], axis=2)
    if width == Q_BLOCK_BYTES[5]:
        fifth = np.unpackbits(
            packed[..., Q_BLOCK_BYTES[4] :].reshape(groups, k_blocks, 8, 8), axis=-1, bitorder="little"
        )
        q = q | (fifth.reshape(q.shape) << 4)
    codes = q.transpose(0, 3, 1, 2, 4).reshape(groups * Q_GROUP, k_blocks * Q_BLOCK)
    s = np.asarray(scales, np.float32)
    if s.ndim == 3:  # centred: d alone
        s = np.stack([s, -q_middle(width, nonlinear) * s], axis=2)
    s = s.transpose(0, 3, 1, 2).reshape(groups * Q_GROUP, k_blocks, 2)
    if nonlinear:
        codes = Q4NL_CODES[codes]
    return np.ascontiguousarray(codes[:n, :k]), np.ascontiguousarray(s[:n, :, 0]), np.ascontiguousarray(s[:n, :, 1])


def dequantize_q(packed, scales, n, k, nonlinear=False):
    """The float32 weight [N, K] a MatMulQ4 / Q5 / Q8 / Q4K / Q5K (``nonlinear``: Q4NL) node holds: d * q + m, in
    float32 and in that order (Q4K / Q5K: (d * sc) * q + (-dmin * mn), as gguf's dequantiser)."""
    codes, d, m = unpack_q(packed, scales, n, k, nonlinear)
    blocks = np.repeat(np.arange(d.shape[1]), Q_BLOCK)[:k]
    return (codes.astype(np.float32) * d[:, blocks] + m[:, blocks]).astype(np.float32)


def gather_q(packed, scales, indices, n, k, nonlinear=False):
    """GatherQ4 / Q5 / Q8 / Q4NL / Q4K / Q5K: rows ``indices`` of ``dequantize_q`` -> float32 [T, K]."""
    return dequantize_q(packed, scales, n, k, nonlinear)[np.asarray(indices, np.int64)]


# blocks of 32 columns per GGUF super-block of 256: MatMulQ3K's and Q6K's d, MatMulQ4K's / Q5K's d and dmin
Q_SUPER_BLOCKS = 8
QK_SUB_BYTES = 32  # MatMulQ4K / Q5K: a block's u8 sub-scales of its 16 rows, then their mins, after its codes
QK_BLOCK_BYTES = {4: Q_BLOCK_BYTES[4] + QK_SUB_BYTES, 5: Q_BLOCK_BYTES[5] + QK_SUB_BYTES}


def pack_qk(codes, sub_scales, mins, d, dmin, bits=4, scale_dtype=np.float16):
    """MatMulQ4K's or MatMulQ5K's weight layout (contrib_ops/matmul_q_kernel.h) of W = d * sc * q - dmin * mn,
    GGUF's Q4_K / Q5_K: codes uint8 [N, K] (0..2^bits - 1), sc and mn uint8 [N, ceil(K / 32)] per row and block,
    d and dmin [N, ceil(K / 256)] per row and super-block -> (packed uint8 [G, KB, 288 or 352], scales
    [G, ceil(KB / 8), 2, 16] of scale_dtype: d, then -dmin). A block is pack_q's block of the codes, then the
    16 rows' sc, then their mn; padding is 0."""
    codes = np.asarray(codes, np.uint8)
    n, k = codes.shape
    groups, k_blocks = -(-n // Q_GROUP), -(-k // Q_BLOCK)
    none = np.zeros((n, k_blocks), np.float32)
    packed, _ = pack_q(codes, none, none, bits)
    sub = np.zeros((groups * Q_GROUP, k_blocks, 2), np.uint8)
    sub[:n, :, 0], sub[:n, :, 1] = sub_scales, mins
    sub = sub.reshape(groups, Q_GROUP, k_blocks, 2).transpose(0, 2, 3, 1).reshape(groups, k_blocks, QK_SUB_BYTES)
    packed = np.concatenate([packed, sub], axis=-1)
    return np.ascontiguousarray(packed), _super_block_scales(d, groups, k_blocks, scale_dtype, dmin)


def unpack_qk(packed, scales, n, k):
    """pack_qk's inverse: (codes uint8 [N, K], sc uint8 [N, KB], mn uint8 [N, KB], d float32 [N, ceil(K / 256)],
    dmin float32 [N, ceil(K / 256)])."""
    groups, k_blocks, width = packed.shape
    packed = np.asarray(packed, np.uint8)
    unit = np.zeros((groups, k_blocks, 2, Q_GROUP), np.float16)
    codes, _, _ = unpack_q(packed[..., : width - QK_SUB_BYTES], unit, n, k)
    sub = packed[..., width - QK_SUB_BYTES :].reshape(groups, k_blocks, 2, Q_GROUP).transpose(0, 3, 1, 2)
    sub = sub.reshape(groups * Q_GROUP, k_blocks, 2)[:n]
    d, dmin = _super_block_d(scales, n, k)
    return (codes, *(np.ascontiguousarray(f) for f in (sub[..., 0], sub[..., 1], d, dmin)))


Q4XS_BLOCK_BYTES = Q_BLOCK_BYTES[4] + Q_GROUP  # MatMulQ4XS: MatMulQ4NL's 4-bit layout, then 16 int8 sub-scales


def pack_q4xs(indices, sub_scales, d, scale_dtype=np.float16):
    """MatMulQ4XS's weight layout (contrib_ops/matmul_q_kernel.h) of W = d * sc * (Q4NL_CODES[i] - 128), GGUF's
    IQ4_XS: indices uint8 [N, K] (0..15), sc int8 [N, ceil(K / 32)] (its ls - 32) per row and block, d
    [N, ceil(K / 256)] per row and 256 columns -> (packed uint8 [G, KB, 272], scales [G, ceil(KB / 8), 16] of
    scale_dtype: d). A block is pack_q's 4-bit block of the indices, then the 16 rows' sc; padding is 0."""
    indices = np.asarray(indices, np.uint8)
    n, k = indices.shape
    groups, k_blocks = -(-n // Q_GROUP), -(-k // Q_BLOCK)
    packed, _ = pack_q(indices, np.zeros((n, k_blocks), np.float32), None, 4)
    sub = np.zeros((groups * Q_GROUP, k_blocks), np.int8)
    sub[:n] = sub_scales
    sub = sub.reshape(groups, Q_GROUP, k_blocks).transpose(0, 2, 1)
    packed = np.concatenate([packed, sub.view(np.uint8)], axis=-1)
    return np.ascontiguousarray(packed), _super_block_scales(d, groups, k_blocks, scale_dtype)


def unpack_q4xs(packed, scales, n, k):
    """pack_q4xs's inverse: (indices uint8 [N, K], sc int8 [N, KB], d float32 [N, ceil(K / 256)])."""
    groups, k_blocks, _ = packed.shape
    packed = np.asarray(packed, np.uint8)
    indices, _, _ = unpack_q(packed[..., : Q_BLOCK_BYTES[4]], np.zeros((groups, k_blocks, 16), np.float16), n, k)
    sub = packed[..., Q_BLOCK_BYTES[4] :].view(np.int8).transpose(0, 2, 1).reshape(groups * Q_GROUP, k_blocks)[:n]
    return indices, np.ascontiguousarray(sub), np.ascontiguousarray(_super_block_d(scales, n, k))


# MatMulQ3K / MatMulQ6K: a block's codes, then 2 x 16 int8 sub-scales; MatMulQ2K: its codes, then 2 x 16 u8 sc | mn << 4
SUB16_BLOCK_BYTES = {2: 160, 3: 224, 6: 416}
SUB16_MIDDLE = {2: 0, 3: 4, 6: 32}  # their codes' middle: w = d * sc * (q - middle) (MatMulQ2K: - dmin * mn)
_SUB16_BITS = {width: bits for bits, width in SUB16_BLOCK_BYTES.items()}


def pack_sub16(codes, sub_scales, d, bits=6, scale_dtype=np.float16):
    """The weight layout (contrib_ops/matmul_q_kernel.h) of MatMulQ6K (``bits`` 6, GGUF's Q6_K, W = d * sc * (q - 32))
    or MatMulQ3K (3, Q3_K, W = d * sc * (q - 4)) (2: MatMulQ2K's codes and sub-scale bytes, for ``pack_q2k``):
    codes uint8 [N, K] (0..2^bits - 1), sc int8 [N, ceil(K / 16)] per row and 16 columns, d [N, ceil(K / 256)] per
    row and 256 columns -> (packed uint8 [G, KB, 416 | 224 | 160], scales [G, ceil(KB / 8), 16] of scale_dtype: d).
    A Q6K block is pack_q's 5-bit block of q & 31, then the sixth bits in the fifth bits' layout; a Q3K block is q & 3
    of vectors c, c + 2, c + 4, c + 6 at bits 0, 2, 4, 6 of the bytes of vector c < 2 (128 bytes), then the third bits
    in the fifth bits' layout (a Q2K block: those 128 bytes alone). Either ends with the 16 rows' sc of the block's
    columns 0..15, then those of 16..31; padding is 0."""
    codes = np.asarray(codes, np.uint8)
    n, k = codes.shape
    groups, k_blocks = -(-n // Q_GROUP), -(-k // Q_BLOCK)
    none = np.zeros((n, k_blocks), np.float32)
    top_bits = np.zeros((groups, k_blocks, 0), np.uint8)  # the sixth or third bits in the fifth bits' layout
    if bits > 2:
        top_bits = pack_q(((codes >> (bits - 1)) & 1) << 4, none, none, 5)[0][..., Q_BLOCK_BYTES[4] :]
    if bits == 6:
        low, _ = pack_q(codes & 31, none, none, 5)
    else:
        eight, _ = pack_q(codes & 3, none, none, 8)  # [G, KB, 512]: vector v's 64 bytes at 64v
        v = eight.reshape(groups, k_blocks, 4, 2, 64)  # [.., p, c, lane]: vector c + 2p
        low = (v[:, :, 0] | v[:, :, 1] << 2 | v[:, :, 2] << 4 | v[:, :, 3] << 6).reshape(groups, k_blocks, 128)
    packed = np.concatenate([low, top_bits, _per_half(sub_scales, groups, k_blocks, np.int8).view(np.uint8)], axis=-1)
    return np.ascontiguousarray(packed), _super_block_scales(d, groups, k_blocks, scale_dtype)


def pack_q2k(codes, sub_scales, mins, d, dmin, scale_dtype=np.float16):
    """MatMulQ2K's weight layout (contrib_ops/matmul_q_kernel.h) of W = d * sc * q - dmin * mn, GGUF's Q2_K: codes
    uint8 [N, K] (0..3), sc and mn uint8 [N, ceil(K / 16)] (0..15) per row and 16 columns, d and dmin [N, ceil(K /
    256)] -> (packed uint8 [G, KB, 160], scales [G, ceil(KB / 8), 2, 16] of scale_dtype: d, then -dmin). A block is
    MatMulQ3K's 2-bit fields of the codes, then sc | mn << 4 of the 16 rows for columns 0..15, then for 16..31."""
    n, k = np.shape(codes)
    sub = (np.asarray(sub_scales, np.uint8) | np.asarray(mins, np.uint8) << 4).view(np.int8)
    packed, _ = pack_sub16(codes, sub, np.zeros((n, 1), np.float32), 2)
    return packed, _super_block_scales(d, -(-n // Q_GROUP), -(-k // Q_BLOCK), scale_dtype, dmin)


def _per_half(values, groups, k_blocks, dtype):
    """A value per row and 16 columns [N, <= 2 KB] as a block's bytes [G, KB, 32]: the 16 rows' for columns 0..15,
    then for 16..31 (padding 0)."""
    out = np.zeros((groups * Q_GROUP, 2 * k_blocks), dtype)
    out[: values.shape[0], : values.shape[1]] = values
    return out.reshape(groups, Q_GROUP, k_blocks, 2).transpose(0, 2, 3, 1).reshape(groups, k_blocks, 2 * Q_GROUP)


def _super_block_scales(d, groups, k_blocks, scale_dtype, dmin=None):
    """d [N, ceil(K / 256)] as scales [G, ceil(KB / 8), 16] of scale_dtype (padding 0); with dmin, [G, ceil(KB / 8),
    2, 16]: d, then -dmin."""
    super_blocks = -(-k_blocks // Q_SUPER_BLOCKS)
    fields = [d] if dmin is None else [d, -np.asarray(dmin, np.float32)]
    scales = np.zeros((groups * Q_GROUP, super_blocks, len(fields)), np.float32)
    for i, f in enumerate(fields):
        scales[: f.shape[0], : f.shape[1], i] = f
    scales = scales.reshape(groups, Q_GROUP, super_blocks, len(fields)).transpose(0, 2, 3, 1)
    return np.ascontiguousarray((scales[:, :, 0] if dmin is None else scales).astype(scale_dtype))


def _super_block_d(scales, n, k):
    """_super_block_scales' inverse: d float32 [N, ceil(K / 256)], or (d, dmin) from scales [G, ceil(KB / 8), 2, 16]."""
    s = np.asarray(scales, np.float32)
    s = s[:, :, None] if s.ndim == 3 else s
    fields = s.transpose(0, 3, 1, 2).reshape(s.shape[0] * Q_GROUP, s.shape[1], -1)[:n, : -(-k // 256)]
    return fields[..., 0] if s.shape[2] == 1 else (fields[..., 0], -fields[..., 1])


def sub16_bits(packed):
    """A sub16 weight's code width, 2, 3 or 6, from its block's bytes."""
    return _SUB16_BITS[packed.shape[-1]]


def _from_halves(bytes_, n, k):
    """_per_half's inverse: a block's 32 bytes [G, KB, 32] -> [N, ceil(K / 16)]."""
    groups, k_blocks, _ = bytes_.shape
    values = bytes_.reshape(groups, k_blocks, 2, Q_GROUP).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(values.reshape(groups * Q_GROUP, 2 * k_blocks)[:n, : -(-k // 16)])


def unpack_sub16(packed, scales, n, k):
    """pack_sub16's inverse: (codes uint8 [N, K], sc int8 [N, ceil(K / 16)], d float32 [N, ceil(K / 256)]); of a
    MatMulQ2K weight (pack_q2k): (codes, sc, d, mn uint8 [N, ceil(K / 16)], dmin float32 [N, ceil(K / 256)])."""
    groups, k_blocks, width = packed.shape
    bits = sub16_bits(packed)
    packed = np.asarray(packed, np.uint8)
    codes_end = width - 2 * Q_GROUP
    unit = np.zeros((groups, k_blocks, 2, Q_GROUP), np.float16)
    if bits == 6:
        low, _, _ = unpack_q(packed[..., : Q_BLOCK_BYTES[5]], unit, n, k)
    else:
        shifts = (2 * np.arange(4, dtype=np.uint8))[:, None, None]  # vector c + 2p at bits 2p of c's bytes
        fields = (packed[..., :128].reshape(groups, k_blocks, 1, 2, 64) >> shifts) & 3
        low, _, _ = unpack_q(fields.reshape(groups, k_blocks, 512), unit, n, k)
    sub = _from_halves(packed[..., codes_end:], n, k)
    if bits == 2:
        d, dmin = _super_block_d(scales, n, k)
        return low, sub & 15, np.ascontiguousarray(d), sub >> 4, np.ascontiguousarray(dmin)
    nibbles = np.zeros((groups, k_blocks, Q_BLOCK_BYTES[4]), np.uint8)
    top_block = np.concatenate([nibbles, packed[..., codes_end - 64 : codes_end]], axis=-1)  # top bits as fifth bits
    top, _, _ = unpack_q(top_block, unit, n, k)
    codes = low | ((top >> 4) << (bits - 1))
    return codes, sub.view(np.int8), np.ascontiguousarray(_super_block_d(scales, n, k))


def _sub16_terms(packed, scales, n, k):
    """(q - middle int64 [N, K], d * sc float32 [N, ceil(K / 16)], -dmin * mn float32 [N, ceil(K / 16)] or None)."""
    codes, sub, d, *mins = unpack_sub16(packed, scales, n, k)
    super_block = np.arange(sub.shape[1]) // 16  # of each 16 columns
    step = d[:, super_block] * sub.astype(np.float32)
    offset = -(mins[1][:, super_block] * mins[0].astype(np.float32)) if mins else None
    return codes.astype(np.int64) - SUB16_MIDDLE[sub16_bits(packed)], step, offset


def dequantize_sub16(packed, scales, n, k):
    """The float32 weight [N, K] a MatMulQ3K / Q6K node holds: (d * sc) * (q - middle), in float32 and in that
    order (as gguf's Q3_K and Q6_K dequantisers); a MatMulQ2K one (d * sc) * q - dmin * mn (as gguf's Q2_K)."""
    signed, step, offset = _sub16_terms(packed, scales, n, k)
    columns = np.arange(k) // 16
    w = step[:, columns] * signed.astype(np.float32)
    return (w if offset is None else w + offset[:, columns]).astype(np.float32)


def gather_sub16(packed, scales, indices, n, k):
    """GatherQ2K / Q3K / Q6K: rows ``indices`` of ``dequantize_sub16`` -> float32 [T, K]."""
    return dequantize_sub16(packed, scales, n, k)[np.asarray(indices, np.int64)]


def matmul_sub16(x, packed, scales, n, bias=None, activation_bits=8):
    """MatMulQ2K / Q3K / Q6K: y[t, r] = sum over blocks b and their halves h of dx[t,b] * d[r, b / 8] * sc[r, 2b + h] *
    ((q - middle)[r, half] . xq[t, half]) (MatMulQ2K: - dmin[r, b / 8] * mn[r, 2b + h] * dx[t,b] * sum(xq[t, half]))
    (+ bias[r]), with ``quantize_activations``' int8 activations (16 bits: summed over x's row and its residual's):
    the integer dot products exactly, the rest in float64."""
    x = np.asarray(x, np.float32)
    t, k = x.shape
    signed_codes, step_16, offset_16 = _sub16_terms(packed, scales, n, k)
    xq, dx, _ = quantize_activations(x, residual=activation_bits == 16)
    rows, k_blocks = dx.shape
    signed = np.zeros((n, k_blocks * Q_BLOCK), np.int64)
    signed[:, :k] = signed_codes
    halves = (rows, k_blocks, 2, 16)
    x_halves = xq.reshape(halves).astype(np.int64)
    dots = np.einsum("tbhi,nbhi->tnbh", x_halves, signed.reshape(n, k_blocks, 2, 16))
    per_half = np.zeros((2, n, 2 * k_blocks), np.float64)  # d * sc, -dmin * mn
    per_half[0, :, : step_16.shape[1]] = step_16
    if offset_16 is not None:
        per_half[1, :, : offset_16.shape[1]] = offset_16
    step, offset = per_half.reshape(2, n, k_blocks, 2)
    y = np.einsum("tnbh,nbh,tb->tn", dots.astype(np.float64), step, dx.astype(np.float64))
    y += np.einsum("tbh,nbh,tb->tn", x_halves.sum(-1).astype(np.float64), offset, dx.astype(np.float64))
    y = y.reshape(t, rows // t if t else 1, n).sum(axis=1)
    if bias is not None:
        y += np.asarray(bias, np.float64)
    return y.astype(np.float32)


def quantize_activations(x, residual=False):
    """MatMulQ4's and MatMulQ8's int8 activations: per row and block of 32 columns (zero-padded), amax = max |x|,
    xq = rint(x * (127 / amax)) (0 where amax = 0), dx = amax / 127, all in float32 ->
    (xq int8 [R, KB * 32], dx float32 [R, KB], dx * sum(xq) float32 [R, KB]). R = T rows, or with
    ``residual`` (activation_bits 16) 2T: row 2t is x's, row 2t + 1 what it misses, r = x - dx * xq rounded
    once to float32 (the kernel's fma), on a grid RESIDUAL_STEPS times finer: xq' = rint(r * (inverse *
    RESIDUAL_STEPS)) clipped to +-127, dx' = dx / RESIDUAL_STEPS. So x ~ dx' * (256 * xq + xq')."""
    x = np.asarray(x, np.float32)
    t, k = x.shape
    k_blocks = -(-k // Q_BLOCK)
    blocks = np.zeros((t, k_blocks * Q_BLOCK), np.float32)
    blocks[:, :k] = x
    blocks = blocks.reshape(t, k_blocks, Q_BLOCK)
    xq, dx, sx, inverse = _quantize_blocks(blocks)
    if residual:
        rest = (blocks.astype(np.float64) - dx[..., None].astype(np.float64) * xq).astype(np.float32)
        xq2 = _codes(rest, (inverse * RESIDUAL_STEPS).astype(np.float32))
        dx2 = (dx / RESIDUAL_STEPS).astype(np.float32)
        sx2 = (dx2 * xq2.astype(np.int32).sum(axis=-1).astype(np.float32)).astype(np.float32)
        xq, dx, sx = (
            np.stack([a, b], axis=1).reshape(2 * t, *a.shape[1:]) for a, b in ((xq, xq2), (dx, dx2), (sx, sx2))
        )
    return xq.reshape(xq.shape[0], -1), dx, sx


def _quantize_blocks(blocks):
    amax = np.abs(blocks).max(axis=-1)
    with np.errstate(divide="ignore"):
        inverse = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    xq = _codes(blocks, inverse)
    dx = (amax / np.float32(127)).astype(np.float32)
    sums = xq.astype(np.int32).sum(axis=-1).astype(np.float32)
    return xq, dx, (dx * sums).astype(np.float32), inverse


def _codes(blocks, inverse):
    """rint(blocks * inverse) in float32, clipped to +-127 -> int8."""
    return np.clip(np.rint(blocks * inverse[..., None]), -127, 127).astype(np.int8)


def matmul_q(x, packed, scales, n, bias=None, activation_bits=8, nonlinear=False):
    """MatMulQ4 / Q5 / Q8 / Q4NL (``nonlinear``) / Q4K / Q5K (d and m from ``unpack_q``):
    y[t, r] = sum_b dx[t,b] * d[r,b] * (q[r, block b] . xq[t, block b]) +
    m[r,b] * dx[t,b] * sum(xq[t, block b]) (+ bias[r]), with the int8 activations of ``quantize_activations``
    (16 bits: the sum of that over x's row and its residual's): the integer dot products exactly, the rest
    accumulated in float64. x [T, K] -> y float32 [T, N]."""
    x = np.asarray(x, np.float32)
    t, k = x.shape
    codes, d, m = unpack_q(packed, scales, n, k, nonlinear)
    xq, dx, sx = quantize_activations(x, residual=activation_bits == 16)
    rows, k_blocks = dx.shape
    padded = np.zeros((n, k_blocks * Q_BLOCK), np.int64)
    padded[:, :k] = codes
    dots = np.einsum(
        "tbi,nbi->tnb", xq.reshape(rows, k_blocks, Q_BLOCK).astype(np.int64), padded.reshape(n, k_blocks, Q_BLOCK)
    ).astype(np.float64)
    y = (dots * (d[None].astype(np.float64) * dx[:, None].astype(np.float64))).sum(-1)
    y += sx.astype(np.float64) @ m.T.astype(np.float64)
    y = y.reshape(t, rows // t if t else 1, n).sum(axis=1)
    if bias is not None:
        y += np.asarray(bias, np.float64)
    return y.astype(np.float32)
