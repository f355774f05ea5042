"""GGUF's Q6_K, held exactly for ``ortserve.MatMulQ6K``: ``w = d * sc * (q - 32)`` with 6-bit codes q, an
int8 scale sc per row and 16 columns and an fp16 d per row and 256 (llama.cpp's super-block). The op's
layout keeps every field at its own width, 6.5625 bits a weight as in the file (its numpy reference:
``pack_q6k`` / ``matmul_q6k`` in ``contrib_ops``).

A Q6_K block is 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales and d. The codes are read
as gguf's own dequantiser reads them: a copy of the blocks with d = 1 dequantises to sc * (q - 32), and
dividing by sc gives q - 32 exactly (a sub-block of sc = 0 holds zeros whatever its codes: any do).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ortserve.ops.paged_attention_reference import dequantize_q6k, pack_q6k

from .gguf_blocks import ONE_HALF, unscaled

_BYTES, _SCALES_AT, _D_AT = 210, 192, 208  # a Q6_K block of 256 weights: its bytes, where its scales and d start
_ROWS = 4096  # rows per chunk: bounds the float temporaries of a large embedding


@dataclass(frozen=True)
class Q6KWeight:
    codes: np.ndarray  # uint8 [N, K], 0..63
    sub_scales: np.ndarray  # int8 [N, K / 16]
    d: np.ndarray  # float32 [N, K / 256], fp16 values

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(codes [G, KB, 416], scales fp16 [G, KB / 8, 16]) as MatMulQ6K reads them."""
        return pack_q6k(self.codes, self.sub_scales, self.d, np.float16)

    def dequantize(self) -> np.ndarray:
        """[N, K] float32: (d * sc) * (q - 32), as gguf forms it."""
        codes, scales = self.packed()
        n, k = self.codes.shape
        return dequantize_q6k(codes, scales, n, k)

    def take_rows(self, order: np.ndarray) -> Q6KWeight:
        """The weight with its output rows reordered."""
        return Q6KWeight(self.codes[order], self.sub_scales[order], self.d[order])


def concat_q6k(parts: list[Q6KWeight]) -> Q6KWeight:
    """The parts of a fused linear stacked along N (all of one width)."""
    if len(parts) == 1:
        return parts[0]
    return Q6KWeight(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("codes", "sub_scales", "d")))


def import_q6k(raw: np.ndarray, rows: int, cols: int) -> Q6KWeight:
    """A Q6_K tensor's raw bytes (``rows`` rows of ``cols`` weights) as its codes and scales, exactly."""
    data = np.ascontiguousarray(raw).view(np.uint8).reshape(rows, -1)
    return concat_q6k([_import_rows(data[r : r + _ROWS], cols) for r in range(0, rows, _ROWS)])


def _import_rows(data: np.ndarray, cols: int) -> Q6KWeight:
    import gguf

    rows = data.shape[0]
    blocks = data.reshape(-1, _BYTES)
    d = blocks[:, _D_AT : _D_AT + 2].copy().view(np.float16).astype(np.float32).reshape(rows, -1)
    sub_scales = blocks[:, _SCALES_AT:_D_AT].view(np.int8).reshape(rows, -1)
    unit = blocks.copy()
    unit[:, _D_AT : _D_AT + 2] = ONE_HALF
    scaled = gguf.quants.dequantize(unit.reshape(rows, -1), gguf.GGMLQuantizationType.Q6_K)  # sc * (q - 32)
    signed = unscaled(scaled.reshape(rows, -1, 16), sub_scales.astype(np.float32))
    codes = (signed + 32).astype(np.uint8).reshape(rows, cols)
    return Q6KWeight(codes, np.ascontiguousarray(sub_scales), np.ascontiguousarray(d))
