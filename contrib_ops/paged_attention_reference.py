"""Numpy references of ortserve's custom ops (domain ``ortserve``): PagedAttention,
PackedPagedAttention, GatedActivation, MatMulQ4 / Q5 / Q8 / Q4NL and GatherQ4 / Q5 / Q8 / Q4NL (and their weight
layout), the input stage of MatMulF and MatMulQ (``linear_input``), AddBlockOffsets and AppendBlockSums.

This file is the specification: the C++ ops in ``contrib_ops/`` must match it.
Shapes (T new tokens, B sequences, D = head_size):
  query [T, num_heads*D], key/value [T, num_kv_heads*D],
  key_cache/value_cache [num_blocks, num_kv_heads, block_size, D] (written in place; PackedPagedAttention
  also takes float16 caches and int8 caches of width D + 4, see ``encode_rows``),
  slot_mapping int64 [T] (-1 = do not write), block_tables int32 [B, max_blocks],
  context_lens int32 [B] (tokens in cache after this step's writes),
  query_start_loc int32 [B+1] (prefix sums of the per-sequence query lengths).
"""

from __future__ import annotations

import numpy as np


def paged_attention(
    query,
    key,
    value,
    key_cache,
    value_cache,
    slot_mapping,
    block_tables,
    context_lens,
    query_start_loc,
    *,
    num_heads,
    num_kv_heads,
    scale=0.0,
    sliding_window=0,
    softcap=0.0,
):
    """Write the new key/value rows into the caches (in place), then attend; returns output."""
    num_tokens = query.shape[0]
    head_size = query.shape[1] // num_heads
    block_size = key_cache.shape[2]
    group = num_heads // num_kv_heads
    scale = scale or 1.0 / np.sqrt(head_size)

    # 1. Cache write: slot = block_id * block_size + offset; -1 skips the token.
    for t, slot in enumerate(slot_mapping):
        if slot >= 0:
            rows = (key[t].reshape(num_kv_heads, head_size), value[t].reshape(num_kv_heads, head_size))
            for cache, x in zip((key_cache, value_cache), rows):
                cache[slot // block_size, :, slot % block_size] = encode_rows(x, cache.dtype)

    # 2. Attention, in float64: query row i of sequence b sits at position p and sees j <= p.
    q = query.reshape(num_tokens, num_heads, head_size).astype(np.float64)
    out = np.zeros((num_tokens, num_heads, head_size), np.float64)
    for b, ctx in enumerate(context_lens):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        positions = np.arange(ctx)
        blocks = block_tables[b][positions // block_size]
        offsets = positions % block_size
        # [ctx, num_heads, D]: cached rows in position order, kv head repeated for its query heads.
        k = np.repeat(decode_rows(key_cache[blocks, :, offsets], head_size).astype(np.float64), group, axis=1)
        v = np.repeat(decode_rows(value_cache[blocks, :, offsets], head_size).astype(np.float64), group, axis=1)
        for i in range(start, end):
            p = ctx - (end - start) + (i - start)
            visible = positions <= p
            if sliding_window > 0:
                visible &= positions > p - sliding_window
            s = np.einsum("hd,jhd->hj", q[i], k[visible]) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            w /= w.sum(axis=1, keepdims=True)
            out[i] = np.einsum("hj,jhd->hd", w, v[visible])
    return out.reshape(num_tokens, num_heads * head_size).astype(np.float32)


# --- cache rows -------------------------------------------------------------------------------
# A cache holds one row per (block, kv head, offset): D float32 values, D float16 values (rounded
# to nearest even), or D int8 codes followed by their float32 scale as 4 bytes (scale = max |x| /
# 127 in float32, code = x / scale rounded to nearest even; x is read back as code * scale).
CACHE_DTYPES = {"fp32": np.float32, "fp16": np.float16, "int8": np.int8}


def cache_row_width(dtype, head_size):
    """The cache's last dimension for heads of ``head_size``: int8 rows carry their scale."""
    return head_size + 4 if np.dtype(dtype) == np.int8 else head_size


def encode_rows(x, dtype):
    """float32 rows [..., D] as cache rows of ``dtype``."""
    x = np.asarray(x, np.float32)
    if np.dtype(dtype) != np.int8:
        return x.astype(dtype)
    scale = (np.abs(x).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore"):
        codes = np.where(scale > 0, np.rint(x / scale), np.float32(0))
    codes = np.clip(codes, -127, 127).astype(np.int8)
    return np.concatenate([codes, np.ascontiguousarray(scale).view(np.int8)], axis=-1)


def decode_rows(rows, head_size):
    """Cache rows [..., width] back to float32 [..., head_size]."""
    if rows.dtype != np.int8:
        return rows.astype(np.float32)
    scale = np.ascontiguousarray(rows[..., head_size:]).view(np.float32)
    return rows[..., :head_size].astype(np.float32) * scale


def rms_norm_heads(x, weight, eps):
    """RMS norm over the last axis (each head's vector), in float32 as the op computes it."""
    x = np.asarray(x, np.float32)
    mean_square = (x * x).sum(axis=-1, keepdims=True, dtype=np.float32) / np.float32(x.shape[-1])
    return (x / np.sqrt(mean_square + np.float32(eps)) * weight).astype(np.float32)


def rotary(x, positions, cos_cache, sin_cache):
    """Non-interleaved rotary on the first rotary_dim = 2 * cos_cache.shape[1] of each head:
    pairs (i, i + rotary_dim / 2) turn by the angle of their position. x: [T, heads, D]."""
    half = cos_cache.shape[1]
    c, s = cos_cache[positions][:, None, :], sin_cache[positions][:, None, :]
    a, b = x[..., :half], x[..., half : 2 * half]
    out = x.copy()
    out[..., :half] = a * c - b * s
    out[..., half : 2 * half] = b * c + a * s
    return out.astype(np.float32)


def paged_attention_packed(
    qkv,
    key_cache,
    value_cache,
    slot_mapping,
    block_tables,
    context_lens,
    query_start_loc,
    positions=None,
    cos_cache=None,
    sin_cache=None,
    q_norm=None,
    k_norm=None,
    *,
    num_heads,
    num_kv_heads,
    scale=0.0,
    sliding_window=0,
    softcap=0.0,
    norm_epsilon=1e-6,
):
    """PackedPagedAttention: qkv [T, (num_heads + 2 num_kv_heads) D] holds the q heads, then the k
    heads, then the v heads. q and k get the per-head RMS norm (when its weight is given), then
    rotary (when the tables are given), then everything is as PagedAttention."""
    num_tokens = qkv.shape[0]
    head_size = qkv.shape[1] // (num_heads + 2 * num_kv_heads)
    q, k, v = np.split(qkv, [num_heads * head_size, (num_heads + num_kv_heads) * head_size], axis=1)
    q = q.reshape(num_tokens, num_heads, head_size)
    k = k.reshape(num_tokens, num_kv_heads, head_size)
    if q_norm is not None:
        q = rms_norm_heads(q, q_norm, norm_epsilon)
    if k_norm is not None:
        k = rms_norm_heads(k, k_norm, norm_epsilon)
    if cos_cache is not None:
        q, k = rotary(q, positions, cos_cache, sin_cache), rotary(k, positions, cos_cache, sin_cache)
    return paged_attention(
        q.reshape(num_tokens, -1),
        k.reshape(num_tokens, -1),
        np.ascontiguousarray(v),
        key_cache,
        value_cache,
        slot_mapping,
        block_tables,
        context_lens,
        query_start_loc,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        scale=scale,
        sliding_window=sliding_window,
        softcap=softcap,
    )


def gated_activation(x, activation):
    """GatedActivation: x = [gate | up] [T, 2I] -> act(gate) * up [T, I]; act is silu
    (g / (1 + e^-g)) or gelu_tanh (g / 2 (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))))."""
    gate, up = np.split(np.asarray(x, np.float64), 2, axis=1)
    if activation == "silu":
        act = gate / (1.0 + np.exp(-gate))
    elif activation == "gelu_tanh":
        act = 0.5 * gate * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (gate + 0.044715 * gate**3)))
    else:
        raise ValueError(f"activation must be 'silu' or 'gelu_tanh', got {activation!r}")
    return (act * up).astype(np.float32)


def linear_input(x, *, gated=None, norm_weight=None, residual=None, norm_epsilon=None):
    """What MatMulF and MatMulQ4 / Q5 / Q8 compute on x before the product -> (input [T, K], sum):
    with ``gated`` ("silu" | "gelu_tanh") x is [gate | up] [T, 2K] and the input is
    ``gated_activation(x, gated)``; with ``norm_weight`` [K] it is x' / sqrt(mean(x'^2) + norm_epsilon)
    * norm_weight, where x' = x + ``residual`` (returned as sum; else None) or x. The mean of the
    squares is accumulated in float64, as onnxruntime's SkipSimplifiedLayerNormalization does."""
    if gated is not None:
        if norm_weight is not None:
            raise ValueError("gated and norm_weight cannot both be set")
        return gated_activation(x, gated), None
    x = np.asarray(x, np.float32)
    if norm_weight is None:
        return x, None
    total = (x + np.asarray(residual, np.float32)).astype(np.float32) if residual is not None else x
    mean_square = (total.astype(np.float64) ** 2).mean(axis=-1, keepdims=True)
    inv = (1.0 / np.sqrt(mean_square + norm_epsilon)).astype(np.float32)
    normed = (total * inv * np.asarray(norm_weight, np.float32)).astype(np.float32)
    return normed, (total if residual is not None else None)


def add_block_offsets(x, y, offsets, block_size):
    """AddBlockOffsets: y + (x summed over each block of block_size columns) @ offsets;
    x [T, K], y [T, N], offsets [K / block_size, N] -> [T, N], accumulated in float64."""
    x = np.asarray(x, dtype=np.float64)
    sums = x.reshape(x.shape[0], x.shape[1] // block_size, block_size).sum(axis=-1)
    return (np.asarray(y, np.float64) + sums @ np.asarray(offsets, np.float64)).astype(np.float32)


def append_block_sums(x, block_size):
    """ortserve's AppendBlockSums op (append_block_sums.h): [x | x summed over each block of
    block_size columns], [T, K] -> [T, K + K / block_size]."""
    x = np.asarray(x, dtype=np.float32)
    sums = x.reshape(x.shape[0], x.shape[1] // block_size, block_size).sum(axis=-1, dtype=np.float32)
    return np.concatenate([x, sums], axis=1)


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
    m = -middle * d."""
    groups, k_blocks, width = packed.shape
    packed = np.asarray(packed, np.uint8)
    if width in QK_BLOCK_BYTES.values():
        codes, sub_scales, mins, d, dmin = unpack_qk(packed, scales, n, k)
        super_block = np.arange(k_blocks) // Q_SUPER_BLOCKS
        return codes, d[:, super_block] * sub_scales, -dmin[:, super_block] * mins
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


Q_SUPER_BLOCKS = 8  # blocks of 32 columns per GGUF super-block of 256: MatMulQ6K's d, MatMulQ4K's / Q5K's d and dmin
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
    super_blocks = -(-k_blocks // Q_SUPER_BLOCKS)
    scales = np.zeros((groups * Q_GROUP, super_blocks, 2), np.float32)
    scales[:n, :, 0], scales[:n, :, 1] = d, -np.asarray(dmin, np.float32)
    scales = scales.reshape(groups, Q_GROUP, super_blocks, 2).transpose(0, 2, 3, 1)
    packed = np.concatenate([packed, sub], axis=-1)
    return np.ascontiguousarray(packed), np.ascontiguousarray(scales.astype(scale_dtype))


def unpack_qk(packed, scales, n, k):
    """pack_qk's inverse: (codes uint8 [N, K], sc uint8 [N, KB], mn uint8 [N, KB], d float32 [N, ceil(K / 256)],
    dmin float32 [N, ceil(K / 256)])."""
    groups, k_blocks, width = packed.shape
    packed = np.asarray(packed, np.uint8)
    unit = np.zeros((groups, k_blocks, 2, Q_GROUP), np.float16)
    codes, _, _ = unpack_q(packed[..., : width - QK_SUB_BYTES], unit, n, k)
    sub = packed[..., width - QK_SUB_BYTES :].reshape(groups, k_blocks, 2, Q_GROUP).transpose(0, 3, 1, 2)
    sub = sub.reshape(groups * Q_GROUP, k_blocks, 2)[:n]
    s = np.asarray(scales, np.float32).transpose(0, 3, 1, 2).reshape(groups * Q_GROUP, -1, 2)[:n]
    fields = (sub[..., 0], sub[..., 1], s[..., 0], -s[..., 1])
    return (codes, *(np.ascontiguousarray(f) for f in fields))


Q6K_BLOCK_BYTES = 416  # MatMulQ6K: the 5-bit layout of q & 31 (320), the sixth bits (64), 2 x 16 int8 sub-scales


def pack_q6k(codes, sub_scales, d, scale_dtype=np.float16):
    """MatMulQ6K's weight layout (contrib_ops/matmul_q_kernel.h) of W = d * sc * (q - 32), GGUF's Q6_K:
    codes uint8 [N, K] (0..63), sc int8 [N, ceil(K / 16)] per row and 16 columns, d [N, ceil(K / 256)]
    per row and 256 columns -> (packed uint8 [G, KB, 416], scales [G, ceil(KB / 8), 16] of
    scale_dtype: d). A block is pack_q's 5-bit block of q & 31, then the sixth bits in the fifth bits'
    layout, then the 16 rows' sc of the block's columns 0..15 and those of 16..31; padding is 0."""
    codes = np.asarray(codes, np.uint8)
    n, k = codes.shape
    groups, k_blocks = -(-n // Q_GROUP), -(-k // Q_BLOCK)
    none = np.zeros((n, k_blocks), np.float32)
    low, _ = pack_q(codes & 31, none, none, 5)
    sixth, _ = pack_q(((codes >> 5) & 1) << 4, none, none, 5)
    sub = np.zeros((groups * Q_GROUP, 2 * k_blocks), np.int8)
    sub[:n, : sub_scales.shape[1]] = sub_scales
    sub = sub.reshape(groups, Q_GROUP, k_blocks, 2).transpose(0, 2, 3, 1).reshape(groups, k_blocks, 2 * Q_GROUP)
    packed = np.concatenate([low, sixth[..., Q_BLOCK_BYTES[4] :], sub.view(np.uint8)], axis=-1)
    super_blocks = -(-k_blocks // Q_SUPER_BLOCKS)
    scales = np.zeros((groups * Q_GROUP, super_blocks), np.float32)
    scales[:n, : d.shape[1]] = d
    scales = scales.reshape(groups, Q_GROUP, super_blocks).transpose(0, 2, 1)
    return np.ascontiguousarray(packed), np.ascontiguousarray(scales.astype(scale_dtype))


def unpack_q6k(packed, scales, n, k):
    """pack_q6k's inverse: (codes uint8 [N, K], sc int8 [N, ceil(K / 16)], d float32 [N, ceil(K / 256)])."""
    groups, k_blocks, _ = packed.shape
    packed = np.asarray(packed, np.uint8)
    unit = np.zeros((groups, k_blocks, 2, Q_GROUP), np.float16)
    low, _, _ = unpack_q(packed[..., : Q_BLOCK_BYTES[5]], unit, n, k)
    sixth_block = np.concatenate([np.zeros_like(packed[..., : Q_BLOCK_BYTES[4]]), packed[..., 320:384]], axis=-1)
    sixth, _, _ = unpack_q(sixth_block, unit, n, k)
    codes = low | ((sixth >> 4) << 5)
    sub = packed[..., 384:].view(np.int8).reshape(groups, k_blocks, 2, Q_GROUP).transpose(0, 3, 1, 2)
    sub = sub.reshape(groups * Q_GROUP, 2 * k_blocks)[:n, : -(-k // 16)]
    d = np.asarray(scales, np.float32).transpose(0, 2, 1).reshape(groups * Q_GROUP, -1)[:n, : -(-k // 256)]
    return codes, np.ascontiguousarray(sub), np.ascontiguousarray(d)


def dequantize_q6k(packed, scales, n, k):
    """The float32 weight [N, K] a MatMulQ6K node holds: (d * sc) * (q - 32), in float32 and in that
    order (as gguf's Q6_K dequantiser)."""
    codes, sub, d = unpack_q6k(packed, scales, n, k)
    columns = np.arange(k)
    step = d[:, columns // 256] * sub[:, columns // 16].astype(np.float32)
    return (step * (codes.astype(np.float32) - np.float32(32))).astype(np.float32)


def gather_q6k(packed, scales, indices, n, k):
    """GatherQ6K: rows ``indices`` of ``dequantize_q6k`` -> float32 [T, K]."""
    return dequantize_q6k(packed, scales, n, k)[np.asarray(indices, np.int64)]


def matmul_q6k(x, packed, scales, n, bias=None, activation_bits=8):
    """MatMulQ6K: y[t, r] = sum over blocks b and their halves h of dx[t,b] * d[r, b / 8] * sc[r, 2b + h] *
    ((q - 32)[r, half] . xq[t, half]) (+ bias[r]), with ``quantize_activations``' int8 activations (16
    bits: summed over x's row and its residual's): the integer dot products exactly, the rest in float64."""
    x = np.asarray(x, np.float32)
    t, k = x.shape
    codes, sub, d = unpack_q6k(packed, scales, n, k)
    xq, dx, _ = quantize_activations(x, residual=activation_bits == 16)
    rows, k_blocks = dx.shape
    signed = np.zeros((n, k_blocks * Q_BLOCK), np.int64)
    signed[:, :k] = codes.astype(np.int64) - 32
    halves = (rows, k_blocks, 2, 16)
    dots = np.einsum("tbhi,nbhi->tnbh", xq.reshape(halves).astype(np.int64), signed.reshape(n, k_blocks, 2, 16))
    sc = np.zeros((n, 2 * k_blocks), np.float64)
    sc[:, : sub.shape[1]] = sub
    step = sc.reshape(n, k_blocks, 2) * d.astype(np.float64)[:, np.arange(k_blocks) // Q_SUPER_BLOCKS, None]
    y = np.einsum("tnbh,nbh,tb->tn", dots.astype(np.float64), step, dx.astype(np.float64))
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
