"""Numpy references of ortserve's custom ops (domain ``ortserve``, version 1): PagedAttention, and
AppendBlockSums at the end of the file.

This file is the specification: the C++ kernel in ``paged_attention.cc`` must match it.
Shapes (T new tokens, B sequences, D = head_size):
  query [T, num_heads*D], key/value [T, num_kv_heads*D],
  key_cache/value_cache [num_blocks, num_kv_heads, block_size, D] (written in place),
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
            key_cache[slot // block_size, :, slot % block_size] = key[t].reshape(num_kv_heads, head_size)
            value_cache[slot // block_size, :, slot % block_size] = value[t].reshape(num_kv_heads, head_size)

    # 2. Attention, in float64: query row i of sequence b sits at position p and sees j <= p.
    q = query.reshape(num_tokens, num_heads, head_size).astype(np.float64)
    out = np.zeros((num_tokens, num_heads, head_size), np.float64)
    for b, ctx in enumerate(context_lens):
        start, end = int(query_start_loc[b]), int(query_start_loc[b + 1])
        positions = np.arange(ctx)
        blocks = block_tables[b][positions // block_size]
        offsets = positions % block_size
        # [ctx, num_heads, D]: cached rows in position order, kv head repeated for its query heads.
        k = np.repeat(key_cache[blocks, :, offsets].astype(np.float64), group, axis=1)
        v = np.repeat(value_cache[blocks, :, offsets].astype(np.float64), group, axis=1)
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


def append_block_sums(x, block_size):
    """ortserve's AppendBlockSums op (append_block_sums.h): [x | x summed over each block of
    block_size columns], [T, K] -> [T, K + K / block_size]."""
    x = np.asarray(x, dtype=np.float32)
    sums = x.reshape(x.shape[0], x.shape[1] // block_size, block_size).sum(axis=-1, dtype=np.float32)
    return np.concatenate([x, sums], axis=1)
