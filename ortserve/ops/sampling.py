"""The op library's one-pass exp and chunk sums for the sampler (contrib_ops/sampling.cc), called
through ctypes: w = e^x and its sums over chunks of tokens, which numpy takes two passes (np.exp, then
np.add.reduceat) and about twice the time for."""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from . import library_path


@cache
def _kernel() -> ctypes._CFuncPtr:
    fn = ctypes.CDLL(library_path()).OrtserveExpChunkSums
    pointer = ctypes.POINTER(ctypes.c_float)
    fn.argtypes = [pointer, pointer, pointer, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64]
    fn.restype = None
    return fn


def exp_chunk_sums(x: np.ndarray, out: np.ndarray, chunk: int) -> np.ndarray:
    """``out`` = e^x for float32 x [rows, vocab] (C order; ``out`` the same shape), and returns the
    sums of ``out`` over consecutive chunks of ``chunk`` tokens [rows, ceil(vocab / chunk)]. As
    numpy's exp where it matters: 0 below -87 (-inf included), +inf above 88, NaN for NaN."""
    if x.dtype != np.float32 or out.dtype != np.float32 or x.shape != out.shape or x.ndim != 2:
        raise ValueError(
            f"exp_chunk_sums needs float32 [rows, vocab] arrays, got {x.dtype} {x.shape}, {out.dtype} {out.shape}"
        )
    if not (x.flags.c_contiguous and out.flags.c_contiguous):
        raise ValueError("exp_chunk_sums needs C-contiguous arrays")
    rows, vocab = x.shape
    sums = np.empty((rows, -(-vocab // chunk)), np.float32)
    pointer = ctypes.POINTER(ctypes.c_float)
    _kernel()(x.ctypes.data_as(pointer), out.ctypes.data_as(pointer), sums.ctypes.data_as(pointer), rows, vocab, chunk)
    return sums
