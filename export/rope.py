"""Rotary tables in numpy: the cos/sin rows ``RotaryEmbedding`` gathers by position.

Each rope_type follows transformers' ``modeling_rope_utils`` (float32 like it, so tables agree to
an ulp). A row per absolute position makes the flattened batch trivial: token t of any sequence
uses row ``positions[t]``. Two position-dependent types are tabulated per row:
- ``dynamic`` (NTK): row p uses the base transformers computes once a sequence reaches p + 1
  tokens, which is what it uses for a token decoded at p. A long prompt prefilled in one
  transformers call uses the base of its full length for every token instead; we cannot, since
  the keys of a paged cache are rotated once.
- ``longrope`` (Phi-3): short factors while the batch's largest position is below the original
  context, long factors otherwise (vLLM's rule). The table is [short rows; long rows] and the graph
  adds ``long_offset`` to the positions when switching.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .config import RopeSpec


@dataclass(frozen=True)
class RopeTable:
    cos: np.ndarray  # float32 [rows, rotary_dim / 2]
    sin: np.ndarray
    long_offset: int = 0  # longrope only: row of position 0 in the long half (0 = no switch)


def _exponents(dim: int) -> np.ndarray:
    return np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)


def _powers(base: float, dim: int) -> np.ndarray:
    """base ** (2i / dim) rounded to float32, which is what torch's float32 pow returns here."""
    return (np.float64(base) ** _exponents(dim).astype(np.float64)).astype(np.float32)


def _default(base: float, dim: int) -> np.ndarray:
    return np.float32(1.0) / _powers(base, dim)


def _llama3(spec: RopeSpec, dim: int) -> np.ndarray:
    inv = _default(spec.theta, dim)
    factor, low, high = spec.get("factor"), spec.get("low_freq_factor"), spec.get("high_freq_factor")
    old = spec.original_max_position_embeddings
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _yarn(spec: RopeSpec, dim: int) -> tuple[np.ndarray, float]:
    original = spec.original_max_position_embeddings
    factor = spec.get("factor") or spec.max_position_embeddings / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = spec.get("attention_factor")
    if attention is None:
        m, m_all = spec.get("mscale"), spec.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    fast, slow = spec.get("beta_fast") or 32, spec.get("beta_slow") or 1

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(spec.theta))

    low, high = correction_dim(fast), correction_dim(slow)
    if spec.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    pos_freqs = _powers(spec.theta, dim)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv.astype(np.float32), float(attention)


def _angles(positions: np.ndarray, inv: np.ndarray) -> np.ndarray:
    return np.outer(positions.astype(np.float32), inv).astype(np.float32)


def rope_table(spec: RopeSpec, num_positions: int) -> RopeTable:
    """cos/sin for positions 0 .. num_positions-1 (scaled by the rope type's attention factor)."""
    dim, positions = spec.rotary_dim, np.arange(num_positions)
    scale = 1.0
    if spec.kind == "default":
        angles = _angles(positions, _default(spec.theta, dim))
    elif spec.kind == "linear":
        angles = _angles(positions, (_default(spec.theta, dim) / np.float32(spec.get("factor"))).astype(np.float32))
    elif spec.kind == "llama3":
        angles = _angles(positions, _llama3(spec, dim))
    elif spec.kind == "yarn":
        inv, scale = _yarn(spec, dim)
        angles = _angles(positions, inv)
    elif spec.kind == "dynamic":
        angles = _angles(positions, _default(spec.theta, dim))
        limit, factor = spec.max_position_embeddings, spec.get("factor")
        for p in range(limit, num_positions):  # only rows past the trained length change
            base = spec.theta * ((factor * (p + 1) / limit) - (factor - 1)) ** (dim / (dim - 2))
            angles[p] = _angles(np.array([p]), _default(base, dim))[0]
    elif spec.kind == "longrope":
        return _longrope(spec, num_positions)
    else:
        raise ValueError(f"unknown rope type {spec.kind}")
    return RopeTable(np.cos(angles) * np.float32(scale), np.sin(angles) * np.float32(scale))


def _longrope(spec: RopeSpec, num_positions: int) -> RopeTable:
    dim, original = spec.rotary_dim, spec.original_max_position_embeddings
    factor = spec.get("factor") or spec.max_position_embeddings / original
    attention = spec.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    base = _powers(spec.theta, dim)

    def table(ext: tuple[float, ...], rows: int) -> np.ndarray:
        return _angles(np.arange(rows), (1.0 / (np.asarray(ext, np.float32) * base)).astype(np.float32))

    short = table(spec.get("short_factor"), min(num_positions, original))
    if num_positions <= original:
        angles, offset = short, 0
    else:
        angles, offset = np.concatenate([short, table(spec.get("long_factor"), num_positions)]), original
    scale = np.float32(attention)
    return RopeTable(np.cos(angles) * scale, np.sin(angles) * scale, offset)
