"""Numpy references of ortserve's custom ops (domain ``ortserve``): PagedAttention,
PackedPagedAttention, GatedActivation, the input stage of MatMulF and MatMulQ (``linear_input``), AddBlockOffsets
and AppendBlockSums; the quantised linears and lookups (MatMulQ*, GatherQ*) are in ``matmul_q_reference.py``.

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
