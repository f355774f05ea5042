"""int4 that keeps its answers: when 4 bits everywhere lose a model's answers, more bits where
llama.cpp's Q4_K_M puts them.

Most models keep their answers at int4 (SmolLM2-135M: 100 % top-1 agreement with fp32). Some do not:
Gemma-3-270m loses a tenth of its next tokens with every layer linear on a 4-bit grid, however the
grid is searched (benchmarks/tables/gptq.md). llama.cpp's Q4_K_M is not 4-bit everywhere either: it
stores the value and down projections of about half the layers (``more_bits``) at 6 bits, and where
K-quants cannot take a row (Gemma's 640-wide ones) it falls back to 5-bit Q5_0.

So a calibrated int4 export measures what it made on the first chunks of its calibration text (not
the quality check's text, which stays a test): top-1 agreement and perplexity ratio against the fp32
reference it already has. When the model has answers to keep (its fp32 perplexity is well below a
uniform guess's; random test checkpoints have none) and int4 falls below ``KEEP_TOP1`` or above
``KEEP_PPL_RATIO``, it quantises again with ``rules``: Q4_K_M's mix on such a model, in ortserve's
formats. 8 bits for the value and down projections of the ``more_bits`` layers; 5 bits for q, k, v,
gate and up elsewhere; 4 bits for the attention output and the other layers' down projections. The
export log says so, and the manifest's weight formats count each precision. ``--pure``
(llama-quantize's flag) or rules of the user's own (``--tensor-precision``) turn this off.
"""

from __future__ import annotations

import re
from pathlib import Path

from .architectures import WeightNames
from .calibration import CalibrationText
from .quality import QualityReport, all_logits, compare, pooled
from .storage import TensorPrecision

KEEP_TOP1 = 0.95  # issue #12's bar for int4
KEEP_PPL_RATIO = 1.02
UNINFORMED_PPL_SHARE = 0.5  # fp32 perplexity >= this x the vocabulary: the model predicts nothing
CHECK_CHUNKS = 4  # calibration chunks of 384 tokens: about 1,500 positions


def more_bits(layer: int, num_layers: int) -> bool:
    """llama.cpp's choice of layers for more bits in Q4_K_M (its use_more_bits): the first and last
    eighth of the layers and every third layer between them."""
    eighth = num_layers // 8
    return layer < eighth or layer >= 7 * num_layers // 8 or (layer - eighth) % 3 == 2


def rules(names: WeightNames, num_layers: int) -> tuple[TensorPrecision, ...]:
    """The fallback's rules for an architecture's weight names (the first matching rule wins)."""

    def exact(templates: list[str | None], layers: list[int]) -> re.Pattern[str]:
        names_ = [t.format(i=i) for t in templates if t for i in layers]
        return re.compile("^(" + "|".join(re.escape(f"{n}.weight") for n in names_) + ")$")

    more = [i for i in range(num_layers) if more_bits(i, num_layers)]
    five = [names.q, names.k, names.v, names.qkv, names.gate, names.up, names.gate_up]
    return (
        TensorPrecision(exact([names.v, names.down], more), "int8"),
        TensorPrecision(exact(five, list(range(num_layers))), "int5"),
    )


def check(artifact: Path, reference: Path, text: CalibrationText) -> QualityReport:
    """The int4 artifact against its fp32 reference on the first chunks of the calibration text, a
    chunk at a time (a chunk's logits over Gemma's 262k vocabulary are 400 MB)."""
    chunks = text.sequences(reference)[:CHECK_CHUNKS]
    return pooled([compare(all_logits(artifact, [ids]), all_logits(reference, [ids]), [ids]) for ids in chunks])


def needs_more_bits(report: QualityReport, vocab_size: int) -> bool:
    """Below the bar, for a model that has answers to keep: one whose fp32 perplexity on the text is
    well below a uniform guess's (random test checkpoints are not: their top-1 is noise)."""
    informative = report.fp32_perplexity < UNINFORMED_PPL_SHARE * vocab_size
    return informative and (report.top1_agreement < KEEP_TOP1 or report.ppl_ratio > KEEP_PPL_RATIO)
