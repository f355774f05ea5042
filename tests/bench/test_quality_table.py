"""benchmarks/quality.py rewrites only the rows it measures: a run on one ISA keeps every other ISA's
rows, a run of one model (--models) keeps the other model's rows, and --ortserve-only keeps this
ISA's llama.cpp rows."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import quality

SMOL, GEMMA = quality.MODELS["smollm2"], quality.MODELS["gemma3"]


def row(model: str, system: str, isa: str) -> str:
    return f"| {model} | {system} | {isa} | 94 | 100.0% | 9.989 | 9.989 | 1.0000 |"


def test_kept_rows_are_those_the_run_does_not_measure(tmp_path, monkeypatch):
    rows = [
        row(SMOL, "ortserve int4", "AVX2"),
        row(SMOL, "llama.cpp Q4_K_M", "AVX2"),
        row(GEMMA, "ortserve int4", "AVX2"),
        row(SMOL, "ortserve int4", "AVX-512+VNNI+BF16"),
    ]
    header = "| model | system | ISA | weights MiB | top-1 agreement | perplexity | fp32 perplexity | ratio |"
    table = tmp_path / "quality.md"
    table.write_text("\n".join(["## title", "", header, "|---|---|---|---|---|---|---|---|", *rows]) + "\n")
    monkeypatch.setattr(quality, "TABLE", table)

    everything = quality._kept_rows("AVX2", llama_cpp_too=False, measured={SMOL, GEMMA})
    assert everything == [rows[3]]
    ortserve_only = quality._kept_rows("AVX2", llama_cpp_too=True, measured={SMOL, GEMMA})
    assert ortserve_only == [rows[1], rows[3]]
    smollm2_only = quality._kept_rows("AVX2", llama_cpp_too=True, measured={SMOL})
    assert smollm2_only == [rows[1], rows[2], rows[3]]
