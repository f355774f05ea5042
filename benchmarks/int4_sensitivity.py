"""Which linears of a model lose its answers at 4 bits: int8 everywhere but one kind of linear at
int4 (``--precision int8 --tensor-precision KIND=int4``), then int4 with the sensitive kinds kept at
8 bits (``--precision int4 --tensor-precision 'A|B=int8'``), measured as benchmarks/quality.py
measures: top-1 agreement with the fp32 export and the perplexity ratio on export/quality.py's
built-in texts. The exports are uncalibrated (``--no-calibration``): this measures the grids
themselves, as llama.cpp's rows (no imatrix) do; tables/quality.md has the calibrated ones. llama.cpp's own 4-bit formats on the same weights (Q4_0, Q4_1) and its Q4_K_M
(on Gemma-3-270m a 5- to 8-bit mix, see tables/quality.md) are the rows to read them against.

    python benchmarks/int4_sensitivity.py     # Gemma-3-270m; writes benchmarks/tables/int4_sensitivity.md
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quality import WORK, gemma_file, llama_cpp_file, llama_cpp_logits, ortserve_artifact, weight_mib
from runners.common import BENCH_DIR, kernel_isa

TABLE = BENCH_DIR / "tables" / "int4_sensitivity.md"
KINDS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MIXES = ("v_proj|up_proj", "v_proj|up_proj|down_proj", "k_proj|v_proj|up_proj|down_proj")


def recipes() -> list[tuple[str, str, list[str]]]:
    """(label, --precision, --tensor-precision rules)."""
    rows = [("int4", "int4", []), ("int8", "int8", [])]
    rows += [(f"int8, {kind} int4", "int8", [f"{kind}=int4"]) for kind in KINDS]
    rows += [(f"int4, {mix.replace('|', ' ')} int8", "int4", [f"{mix}=int8"]) for mix in MIXES]
    return rows


def costs(rows: list) -> str:
    """'v_proj -8.3 points, up_proj -7.9 points, ...': top-1 points each kind loses alone, costliest first."""
    int8 = next(r for name, _, _, r in rows if name == "ortserve int8").top1_agreement
    prefix = "ortserve int8, "
    alone = {
        name[len(prefix) :].split()[0]: r.top1_agreement - int8 for name, _, _, r in rows if name.startswith(prefix)
    }
    return ", ".join(f"{kind} {100 * loss:+.1f} points" for kind, loss in sorted(alone.items(), key=lambda kv: kv[1]))


def export(source: Path, label: str, precision: str, rules: list[str]) -> Path:
    from ortserve.export import export_model

    out = WORK / "sensitivity" / label.replace(", ", "-").replace(" ", "_")
    if not (out / "ortserve.json").is_file():
        export_model(source, out, precision=precision, tensor_precision=rules, calibrate=False, progress=False)
    return out


def main() -> int:
    from ortserve.export.quality import all_logits, compare, text_ids
    from ortserve.models import prepare_checkpoint

    gguf = gemma_file()
    checkpoint = prepare_checkpoint(gguf, progress=False)
    fp32 = ortserve_artifact(checkpoint, gguf.stem, "fp32")
    sequences = text_ids(fp32)
    reference = all_logits(fp32, sequences)
    rows = []
    for label, precision, rules in recipes():
        artifact = export(checkpoint, label, precision, rules)
        report = compare(all_logits(artifact, sequences), reference, sequences)
        rows.append(
            (f"ortserve {label}", " ".join(f"--tensor-precision '{r}'" for r in rules), weight_mib(artifact), report)
        )
        print(f"{rows[-1][0]:50s} {rows[-1][2]:6.0f} MiB  {report.summary()}", flush=True)
    llama_reference = llama_cpp_logits(llama_cpp_file(gguf, gguf.stem, "F32"), sequences)
    for kind in ("Q4_0", "Q4_1", "Q4_K_M"):
        path = llama_cpp_file(gguf, gguf.stem, kind)
        report = compare(llama_cpp_logits(path, sequences), llama_reference, sequences)
        rows.append((f"llama.cpp {kind}", "", weight_mib(path), report))
        print(f"{rows[-1][0]:50s} {rows[-1][2]:6.0f} MiB  {report.summary()}", flush=True)
    lines = [
        "## Which linears need 8 bits: int4 sensitivity of Gemma-3-270m",
        "",
        f"`python benchmarks/int4_sensitivity.py` on {kernel_isa()}, uncalibrated exports (`--no-calibration`: the "
        "grids themselves; tables/quality.md has calibrated int4 and int5): the Gemma-3-270m Q4_K_M file dequantised "
        "(the fp32 weights every row quantises), top-1 agreement with each system's own fp32 run and the "
        f"perplexity ratio over the {rows[0][3].positions} positions of `export/quality.py`'s texts. Every "
        "ortserve row keeps the LM head (tied to the embedding) at int8. The 'int8, X int4' rows put one kind of "
        f"linear on the 4-bit grid: what it costs alone ({costs(rows)}).",
        "",
        "| system | export flags beyond --precision | weights MiB | top-1 agreement | perplexity ratio |",
        "|---|---|---|---|---|",
        *(
            f"| {name} | {flags and '`' + flags.replace('|', chr(92) + '|') + '`'} | {mib:.0f} | {r.top1_agreement:.1%} "
            f"| {r.ppl_ratio:.4f} |"
            for name, flags, mib, r in rows
        ),
    ]
    TABLE.write_text("\n".join(lines) + "\n")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
