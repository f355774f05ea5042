"""Rotary embeddings: each rope_type's frequencies in numpy, and the few graph nodes that turn a
step's positions into its cos/sin rows.

Each rope_type follows transformers' ``modeling_rope_utils`` (float32 like it, so the rows agree to
an ulp). Most types rotate position p by p * inv[i] for a fixed vector ``inv``: the graph computes
that step's rows, cos(p * inv) and sin(p * inv) for the T positions of the flattened batch
(``rope_step_nodes``), so an artifact stores rotary_dim / 2 floats, not a table of every position
up to the context length (64 MiB for Gemma 3's two ropes at 32k positions). Two types are special:
- ``longrope`` (Phi-3): short factors while the batch's largest position is below the original
  context, long factors otherwise (vLLM's rule): the graph picks one of two vectors per step.
- ``dynamic`` (NTK): position p past the trained length uses the base transformers computes once a
  sequence reaches p + 1 tokens, which is what it uses for a token decoded at p. Its frequencies
  depend on the position, so it keeps a table (``RopeTable``) that the op reads by position. A
  long prompt prefilled in one transformers call uses the base of its full length for every token
  instead; we cannot, since the keys of a paged cache are rotated once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from .config import RopeSpec


@dataclass(frozen=True)
class RopeFrequencies:
    """Position p turns by p * inv[i]; cos and sin are scaled by ``scale`` (yarn's, longrope's
    attention factor). longrope: ``long_inv`` once any position of the step reaches ``switch``."""

    inv: np.ndarray  # float32 [rotary_dim / 2]
    scale: float = 1.0
    long_inv: np.ndarray | None = None
    switch: int = 0


@dataclass(frozen=True)
class RopeTable:
    """``dynamic`` only: a row per position, read by the op at ``positions[t]``."""

    cos: np.ndarray  # float32 [rows, rotary_dim / 2]
    sin: np.ndarray


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


def rope_frequencies(spec: RopeSpec, max_model_len: int) -> RopeFrequencies | RopeTable:
    """The frequencies of every type but ``dynamic``, whose rows are tabulated up to ``max_model_len``."""
    dim = spec.rotary_dim
    if spec.kind == "default":
        return RopeFrequencies(_default(spec.theta, dim))
    if spec.kind == "linear":
        return RopeFrequencies((_default(spec.theta, dim) / np.float32(spec.get("factor"))).astype(np.float32))
    if spec.kind == "llama3":
        return RopeFrequencies(_llama3(spec, dim))
    if spec.kind == "yarn":
        inv, scale = _yarn(spec, dim)
        return RopeFrequencies(inv, scale)
    if spec.kind == "longrope":
        return _longrope(spec, max_model_len)
    if spec.kind == "dynamic":
        return _dynamic_table(spec, max_model_len)
    raise ValueError(f"unknown rope type {spec.kind}")


def _dynamic_table(spec: RopeSpec, num_positions: int) -> RopeTable:
    dim, positions = spec.rotary_dim, np.arange(num_positions)
    angles = _angles(positions, _default(spec.theta, dim))
    limit, factor = spec.max_position_embeddings, spec.get("factor")
    for p in range(limit, num_positions):  # only rows past the trained length change
        base = spec.theta * ((factor * (p + 1) / limit) - (factor - 1)) ** (dim / (dim - 2))
        angles[p] = _angles(np.array([p]), _default(base, dim))[0]
    return RopeTable(np.cos(angles), np.sin(angles))


def _longrope(spec: RopeSpec, max_model_len: int) -> RopeFrequencies:
    dim, original = spec.rotary_dim, spec.original_max_position_embeddings
    factor = spec.get("factor") or spec.max_position_embeddings / original
    attention = spec.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    base = _powers(spec.theta, dim)

    def inv(ext: tuple[float, ...]) -> np.ndarray:
        return (1.0 / (np.asarray(ext, np.float32) * base)).astype(np.float32)

    if max_model_len <= original:  # no position ever reaches the long factors
        return RopeFrequencies(inv(spec.get("short_factor")), float(attention))
    return RopeFrequencies(inv(spec.get("short_factor")), float(attention), inv(spec.get("long_factor")), original)


def rope_step_nodes(
    freqs: RopeFrequencies, prefix: str, positions: str = "positions"
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto], tuple[str, str, str]]:
    """Nodes computing one step's rows [T, rotary_dim / 2] from ``positions`` [T] (int64): the
    float32 product p * inv (as numpy's and transformers' outer products round it), then Cos and
    Sin (onnxruntime's are within 2 ulp up to 128k positions), times the scale. Returns (nodes,
    constants, (rows, cos, sin)), rows = 0 .. T-1: the op reads row t for token t."""
    nodes: list[onnx.NodeProto] = []
    consts = [onnx.numpy_helper.from_array(freqs.inv, f"{prefix}.inv")]

    def node(op_type: str, inputs: list[str], **attrs) -> str:
        out = f"{prefix}.{op_type.lower()}{len(nodes)}"
        nodes.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
        return out

    def const(name: str, value: np.ndarray) -> str:
        consts.append(onnx.numpy_helper.from_array(value, f"{prefix}.{name}"))
        return consts[-1].name

    inv = consts[0].name
    if freqs.long_inv is not None:  # longrope: every row turns by the long factors once one position reaches them
        longest = node("ReduceMax", [positions], keepdims=0)
        use_long = node("GreaterOrEqual", [longest, const("switch", np.array(freqs.switch, np.int64))])
        inv = node("Where", [use_long, const("long_inv", freqs.long_inv), inv])
    column = node("Unsqueeze", [node("Cast", [positions], to=TensorProto.FLOAT), const("axis", np.array([1]))])
    angles = node("Mul", [column, inv])
    cos, sin = node("Cos", [angles]), node("Sin", [angles])
    if freqs.scale != 1.0:
        scale = const("scale", np.array(freqs.scale, np.float32))
        cos, sin = node("Mul", [cos, scale]), node("Mul", [sin, scale])
    zero, one = const("zero", np.array(0, np.int64)), const("one", np.array(1, np.int64))
    rows = node("Range", [zero, node("Gather", [node("Shape", [positions]), zero], axis=0), one])
    return nodes, consts, (rows, cos, sin)
