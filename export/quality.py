"""The quality check of a quantised artifact: its next-token predictions against the fp32 model's
on a small built-in text set, without torch.

- top-1 agreement: the share of positions where both pick the same next token;
- perplexity ratio: perplexity of the texts under the quantised model / under fp32 (1.0 = no loss).

``ortserve export --precision int4|int5|int8`` prints both and warns below ``TOP1_THRESHOLD`` or above
``PPL_RATIO_THRESHOLD``; benchmarks/quality.py puts them beside llama.cpp's on the same texts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

TOP1_THRESHOLD = 0.90
PPL_RATIO_THRESHOLD = 1.10

# Short, varied English and code: about 600 tokens with a 50k vocabulary.
TEXTS = (
    "The Industrial Revolution began in Great Britain in the late eighteenth century and spread to continental "
    "Europe and North America. It replaced hand production with machines, new chemical processes and iron "
    "production, and it changed how people lived and worked. Cities grew quickly as workers moved from farms to "
    "factories, and steam power made railways and ships faster.",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to make glucose "
    "and oxygen. It takes place mainly in the chloroplasts of leaf cells, where the pigment chlorophyll absorbs "
    "light. The oxygen released is what most living things breathe.",
    "import numpy as np\n\n\ndef softmax(x, axis=-1):\n    shifted = x - x.max(axis=axis, keepdims=True)\n"
    "    exp = np.exp(shifted)\n    return exp / exp.sum(axis=axis, keepdims=True)\n\n\nprint(softmax(np.arange(4)))\n",
    "Once upon a time, in a small village at the edge of a forest, there lived an old baker named Tomas. Every "
    "morning before sunrise he lit his oven and baked bread for the whole village. One winter the flour ran out, "
    "and the children went hungry until a stranger arrived with a cart full of grain.",
    "To find the area of a circle, multiply pi by the square of the radius. For example, a circle with a radius "
    "of 3 centimetres has an area of about 28.27 square centimetres, because 3 squared is 9 and 9 times 3.14159 "
    "is roughly 28.27.",
    "Question: What is the capital of France?\nAnswer: The capital of France is Paris, which is also its largest "
    "city. It lies on the river Seine, in the north of the country, and is known for the Eiffel Tower, the Louvre "
    "museum and its cafes.",
    "The Amazon rainforest covers much of the Amazon basin in South America. It is home to millions of species of "
    "insects, plants, birds and other forms of life, many of which have not yet been described by scientists. "
    "Deforestation threatens the forest and the climate of the whole planet.",
)


@dataclass(frozen=True)
class QualityReport:
    top1_agreement: float
    perplexity: float
    fp32_perplexity: float
    positions: int

    @property
    def ppl_ratio(self) -> float:
        return self.perplexity / self.fp32_perplexity

    @property
    def ok(self) -> bool:
        return self.top1_agreement >= TOP1_THRESHOLD and self.ppl_ratio <= PPL_RATIO_THRESHOLD

    def summary(self, text: str = "built-in text") -> str:
        return (
            f"top-1 agreement with fp32 {self.top1_agreement:.1%}, perplexity {self.perplexity:.2f} vs fp32 "
            f"{self.fp32_perplexity:.2f} (ratio {self.ppl_ratio:.3f}) over {self.positions} positions of {text}"
        )

    def warning(self) -> str | None:
        if self.ok:
            return None
        return (
            f"the quantised model falls below the quality check (top-1 agreement >= {TOP1_THRESHOLD:.0%}, "
            f"perplexity ratio <= {PPL_RATIO_THRESHOLD:g}): {self.summary()}. Try --precision int5 or int8, or "
            "keep the most sensitive linears at 8 bits (--tensor-precision 'v_proj|up_proj|down_proj=int8' for "
            "llama-style names; benchmarks/int4_sensitivity.py measures which), or calibrate on text like your "
            "own (--calibration-text FILE), or check the artifact on your own prompts"
        )


def text_ids(artifact: str | Path) -> list[list[int]]:
    """The built-in texts tokenised with the artifact's tokenizer (its BOS, if it adds one)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(artifact) / "tokenizer.json"))
    return [tokenizer.encode(text).ids for text in TEXTS]


def all_logits(artifact: str | Path, sequences: list[list[int]]) -> list[np.ndarray]:
    """Logits at every position of each sequence, each prefilled in one step."""
    from .validate import PagedRunner, teacher_forced_logits

    blocks = sum(-(-len(s) // 16) for s in sequences) + len(sequences)
    runner = PagedRunner(artifact, block_size=16, num_blocks=blocks)
    return teacher_forced_logits(runner, sequences, [len(s) for s in sequences])


def perplexity(logits: list[np.ndarray], sequences: list[list[int]]) -> float:
    """exp(mean negative log-likelihood of each next token)."""
    nll = []
    for rows, ids in zip(logits, sequences):
        rows = rows[:-1].astype(np.float64)
        log_z = np.log(np.exp(rows - rows.max(-1, keepdims=True)).sum(-1)) + rows.max(-1)
        nll.append(log_z - rows[np.arange(len(ids) - 1), ids[1:]])
    return float(np.exp(np.concatenate(nll).mean()))


def compare(quantised: list[np.ndarray], fp32: list[np.ndarray], sequences: list[list[int]]) -> QualityReport:
    same = sum(int((q[:-1].argmax(-1) == f[:-1].argmax(-1)).sum()) for q, f in zip(quantised, fp32))
    positions = sum(len(s) - 1 for s in sequences)
    return QualityReport(same / positions, perplexity(quantised, sequences), perplexity(fp32, sequences), positions)


def pooled(reports: list[QualityReport]) -> QualityReport:
    """One report for the positions of several (perplexity: exp of the mean negative log-likelihood)."""
    positions = sum(r.positions for r in reports)

    def mean_log(values: list[float]) -> float:
        return float(np.exp(sum(np.log(v) * r.positions for v, r in zip(values, reports)) / positions))

    top1 = sum(r.top1_agreement * r.positions for r in reports) / positions
    return QualityReport(
        top1, mean_log([r.perplexity for r in reports]), mean_log([r.fp32_perplexity for r in reports]), positions
    )


def check(artifact: str | Path, fp32_artifact: str | Path) -> QualityReport | None:
    """None when the artifact has no tokenizer.json to read the texts with."""
    if not (Path(artifact) / "tokenizer.json").is_file():
        return None
    sequences = text_ids(artifact)
    return compare(all_logits(artifact, sequences), all_logits(fp32_artifact, sequences), sequences)
