"""How each linear weight is stored in the artifact: fp32, a GGUF tensor's own codes, or
quantised here. One rule, decided per tensor before any weight is read:

- ``--precision fp32``: fp32 (a GGUF tensor is dequantised exactly).
- a GGUF tensor of a format in ``gguf_blocks.FORMATS`` or a K-quant (``kquants``: Q4_K, Q5_K, Q6_K, Q3_K, Q2_K), or a
  quantised Hugging Face checkpoint's linear grouped in blocks of 32 (``hf_quantized``): its codes, imported
  exactly, whatever the
  precision (Q8_0 stays 8-bit under int4: re-quantising would only lose information).
- a GGUF tensor of another quantised format (IQ1-IQ3), or a quantised checkpoint's
  linear without an exact integer form (FP8, groups under 32 columns): dequantised, then quantised
  to the precision (when none is given int4, and int8 for FP8) -- export lists these.
- a float tensor: the precision (fp32 when none is given), quantised by ``qweight.quantize_q``.

``--tensor-precision PATTERN=PRECISION`` (``TensorPrecision``) replaces the precision of the
tensors whose name matches, before the rule runs: llama-quantize's ``--tensor-type``, for keeping
a model's most sensitive linears at 8 bits under int4.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ortserve.artifact import PRECISIONS

from .errors import ExportError
from .nbits import BITS
from .weights import WeightSource


@dataclass(frozen=True)
class Storage:
    kind: Literal["fp32", "exact", "quantize"]
    bits: int = 32  # the codes' width: 4, 5, 8 (MatMulQ4 / Q5 / Q8 and variants), 6 / 3 / 2 (MatMulQ6K / Q3K / Q2K)
    source_type: str = "F32"  # the GGUF type of the source tensor (F32 for safetensors)
    # "NL": IQ4 (MatMulQ4NL); "S": centred codes, m = -middle * d (Q4_0, Q5_0, Q8_0, and IQ4: "NLS"); "K": GGUF's
    # K-quant super-blocks (MatMulQ4K / Q5K / Q6K / Q3K / Q2K)
    variant: str = ""

    @property
    def key(self) -> tuple:
        """Parts of a fused linear with equal keys share one node: each MatMulQ op's d * q + m holds
        every format of its width (MatMulQ4NL only the IQ4 formats, MatMulQ4K / Q5K / Q6K only their K-quant)."""
        return self.kind == "fp32", self.bits, self.variant

    @property
    def q_format(self) -> str:
        """The MatMulQ / GatherQ op's suffix: '4', '5', '8', '4NL', '4S', '5S', '8S', '4NLS', '4K', '5K', '6K', '3K',
        '2K' or '4XS'."""
        return f"{self.bits}{self.variant}"

    @property
    def label(self) -> str:
        """For the export report: 'Q4_K (exact)', 'int4', 'fp32', 'IQ3_XXS -> int4'."""
        if self.kind == "exact":
            return f"{self.source_type} (exact)"
        name = "fp32" if self.kind == "fp32" else f"int{self.bits}"
        return name if self.source_type in FLOAT_TYPES else f"{self.source_type} -> {name}"


FLOAT_TYPES = ("F32", "F16", "BF16")
FP32 = Storage("fp32")


@dataclass(frozen=True)
class TensorPrecision:
    """Linear weights whose checkpoint name (Hugging Face style, a GGUF's translated) matches
    ``pattern`` (``re.search``) are stored at ``precision``; the first matching rule wins."""

    pattern: re.Pattern[str]
    precision: str

    @classmethod
    def parse(cls, text: str) -> TensorPrecision:
        """'v_proj|down_proj=int8' -> the rule; an ExportError that names the flag otherwise."""
        pattern, _, precision = text.rpartition("=")
        if not pattern or precision not in PRECISIONS:
            raise ExportError(
                f"--tensor-precision {text!r} is not PATTERN=PRECISION with PRECISION one of {', '.join(PRECISIONS)} "
                "(for example 'v_proj|down_proj=int8')"
            )
        try:
            return cls(re.compile(pattern), precision)
        except re.error as exc:
            raise ExportError(f"--tensor-precision {text!r}: {pattern!r} is not a regular expression ({exc})") from None

    def __str__(self) -> str:
        return f"{self.pattern.pattern}={self.precision}"


def plan(source: WeightSource, name: str, precision: str | None, rules: Sequence[TensorPrecision] = ()) -> Storage:
    """How the linear weight ``name`` is stored, for ``precision`` (None: the source's own) unless
    one of ``rules`` matches the name."""
    precision = next((rule.precision for rule in rules if rule.pattern.search(name)), precision)
    source_type = source.gguf_type(name)
    if precision == "fp32":
        return Storage("fp32", source_type=source_type)
    layout = source.code_layout(name)  # MatMulQ4 / Q5 / Q8 / Q4NL / Q4K / Q5K / Q6K
    if layout is not None:
        return Storage("exact", layout.bits, source_type, layout.variant)
    if source_type in FLOAT_TYPES and precision is None:
        return Storage("fp32", source_type=source_type)
    nearest = "int8" if " fp8 " in f"{source_type} " else "int4"  # an FP8 checkpoint keeps 8 bits
    return Storage("quantize", BITS[precision or nearest], source_type)
