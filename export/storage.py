"""How each linear weight is stored in the artifact: fp32, a GGUF tensor's own codes, or
quantised here. One rule, decided per tensor before any weight is read:

- ``--precision fp32``: fp32 (a GGUF tensor is dequantised exactly).
- a GGUF tensor of a format in ``gguf_blocks.FORMATS``: its codes, imported exactly, whatever
  the precision (Q8_0 stays 8-bit under int4: re-quantising would only lose information).
- a GGUF tensor of another quantised format (Q2_K, Q3_K, IQ*): dequantised, then quantised to
  the precision (int4 when none is given) -- export lists these.
- a float tensor: the precision (fp32 when none is given), quantised by ``q4.quantize_q4`` (int4)
  or ``quantize.quantize`` (int8).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .gguf_blocks import FORMATS
from .quantize import BITS, BLOCK_SIZE, prefers_offsets
from .weights import WeightSource


@dataclass(frozen=True)
class Storage:
    kind: Literal["fp32", "exact", "quantize"]
    bits: int = 32
    block_size: int = BLOCK_SIZE
    zero_points: bool = False  # the MatMulNBits zero-point input is given (not the midpoint)
    offsets: bool = False  # float block offsets, added through the block sums of x
    source_type: str = "F32"  # the GGUF type of the source tensor (F32 for safetensors)

    @property
    def key(self) -> tuple:
        """Parts of a fused linear with equal keys share one node: every 4-bit part one MatMulQ4
        (its d * q + m holds each 4-bit format), 8-bit parts one MatMulNBits per layout."""
        if self.bits == 4:
            return (4,)
        return self.kind == "fp32", self.bits, self.block_size, self.zero_points, self.offsets

    @property
    def label(self) -> str:
        """For the export report: 'Q4_K (exact)', 'int4', 'fp32', 'Q3_K -> int4'."""
        if self.kind == "exact":
            return f"{self.source_type} (exact)"
        name = "fp32" if self.kind == "fp32" else f"int{self.bits}"
        return name if self.source_type in FLOAT_TYPES else f"{self.source_type} -> {name}"


FLOAT_TYPES = ("F32", "F16", "BF16")
FP32 = Storage("fp32")


def plan(source: WeightSource, name: str, precision: str | None, transpose: bool = False) -> Storage:
    """How the linear weight ``name`` is stored, for ``precision`` (None: the source's own).
    Quantised here, it gets float block offsets only when a sample of its rows sits on a
    ``min + step * q`` grid (``quantize.prefers_offsets``)."""
    source_type = source.gguf_type(name)
    if precision == "fp32":
        return Storage("fp32", source_type=source_type)
    fmt = FORMATS.get(source_type)
    if fmt is not None:
        midpoint = fmt.zero_point == 1 << (fmt.bits - 1)
        return Storage("exact", fmt.bits, fmt.block_size, not midpoint, fmt.offsets, source_type)
    if source_type in FLOAT_TYPES and precision is None:
        return Storage("fp32", source_type=source_type)
    bits = BITS[precision or "int4"]
    if bits == 4:  # MatMulQ4 always has float block minimums (q4.py)
        return Storage("quantize", 4, BLOCK_SIZE, False, False, source_type)
    offsets = prefers_offsets(source.sample(name, transpose=transpose), bits)
    return Storage("quantize", bits, BLOCK_SIZE, True, offsets, source_type)
