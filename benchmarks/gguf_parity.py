"""ortserve's logits on GGUF files that llama.cpp made equal llama.cpp's logits on the same files.

For each of the nine families, a tiny random Hugging Face checkpoint (peers/gguf_peer.py) goes
through llama.cpp's own convert_hf_to_gguf.py (f32), then llama-quantize to Q8_0, Q4_0 and
Q4_K_M (and Q3_K_M, Q2_K, IQ4_NL, IQ4_XS). ortserve exports each file (its codes imported exactly) and computes the logits at every
position of a 48-token sequence (24 prefilled, then one token per step); llama.cpp computes them
through llama-cpp-python with ``logits_all`` (f32 KV cache). The table goes to
benchmarks/tables/gguf_parity.md (RESULTS.md includes it).

    bash benchmarks/peers/setup.sh                  # once
    python benchmarks/gguf_parity.py                # all families and types (~5 min on 2 cores)
    python benchmarks/gguf_parity.py --families gemma3 --types F32 Q4_K_M

Tolerance: f32 files: ortserve within 1e-3 of transformers on the original checkpoint, and within
1e-2 of llama.cpp (whose GELU is an fp16 lookup table: Gemma and GPT-2 logits move by ~4e-3, the
SiLU families by ~3e-5). Quantised files: llama.cpp quantises activations to 8 bits (per 32 or 256
values in q8_0 / q8_K); ortserve holds them to about 16 bits by default (MatMulQ4 / Q5 / Q8 / Q4NL /
Q4K / Q5K / Q6K / Q3K / Q2K; MatMulQ4K and Q5K compute bit for bit what MatMulQ4 and Q5 did for Q4_K and Q5_K before
op_version 12, so this table stands; until op_version 11 Q6_K tensors, such as the LM head of Q4_0 and Q4_K_M files, went through
onnxruntime's MatMulNBits with 8-bit activations), so the two differ by llama.cpp's rounding; ortserve passes when its logits are no
further from the exact result (the same file's weights, fp32 activations) than 1.5x llama.cpp's own
distance.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from runners.common import BENCH_DIR, LLAMA_BIN, PEERS_PY, RESULTS
from runners.llamacpp import convert_script

FAMILIES = ("llama", "llama3-rope", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3", "gpt2")
TYPES = ("F32", "Q8_0", "Q4_0", "Q4_K_M", "Q3_K_M", "Q2_K", "IQ4_NL", "IQ4_XS")
WORK = RESULTS / "gguf-parity"
TABLE = BENCH_DIR / "tables" / "gguf_parity.md"
LENGTH, PROMPT = 48, 24
EXACT_TOLERANCE, GELU_TOLERANCE, NOISE_TOLERANCE = 1e-3, 1e-2, 1.5


def peer(*args: str) -> None:
    subprocess.run([str(PEERS_PY), str(BENCH_DIR / "peers" / "gguf_peer.py"), *args], check=True)


def gguf_files(family: str, types: list[str]) -> dict[str, Path]:
    folder = WORK / "gguf" / family
    folder.mkdir(parents=True, exist_ok=True)
    f32 = folder / f"{family}-F32.gguf"
    if not f32.is_file():
        subprocess.run(
            [
                str(PEERS_PY),
                str(BENCH_DIR / "peers" / "convert_gguf.py"),
                str(convert_script()),
                "--pre-fallback",  # Qwen2's tokenizer class re-spells SmolLM2's pre-tokenizer
                "smollm",
                "--",
                str(WORK / "hf" / family),
                "--outtype",
                "f32",
                "--outfile",
                str(f32),
            ],
            check=True,
            capture_output=True,
        )
    files = {}
    for kind in types:
        path = folder / f"{family}-{kind}.gguf"
        if kind != "F32" and not path.is_file():
            subprocess.run(
                [str(LLAMA_BIN / "llama-quantize"), str(f32), str(path), kind], check=True, capture_output=True
            )
        files[kind] = path
    return files


def llama_cpp_logits(path: Path, ids: list[int]) -> np.ndarray:
    ids_file, out = path.with_suffix(".ids.json"), path.with_suffix(".llama.npz")
    ids_file.write_text(json.dumps([ids]))
    peer("logits", str(path), str(ids_file), str(out))
    return np.load(out)["arr_0"]


def transformers_logits(family: str, ids: list[int]) -> np.ndarray:
    ids_file, out = WORK / "hf" / family / "ids.json", WORK / "hf" / family / "transformers.npy"
    ids_file.write_text(json.dumps(ids))
    peer("hf-logits", str(WORK / "hf" / family), str(ids_file), str(out))
    return np.load(out)


def ortserve_logits(path: Path, ids: list[int], precision: str | None = None) -> tuple[np.ndarray, dict[str, int]]:
    from ortserve.export import export_model
    from ortserve.export.validate import PagedRunner, teacher_forced_logits

    from ortserve.artifact import load_manifest

    artifact = WORK / "artifacts" / f"{path.stem}-{precision or 'native'}"
    export_model(path, artifact, precision=precision, progress=False)
    logits = teacher_forced_logits(PagedRunner(artifact, num_blocks=16), [ids], [PROMPT])[0]
    return logits, load_manifest(artifact).weight_formats


def compare(family: str, kind: str, path: Path) -> dict:
    """ortserve vs llama.cpp, and both vs the exact result: the file's weights dequantised, with
    fp32 activations (ortserve's --precision fp32 export, which the F32 rows check against llama.cpp)."""
    vocab = int(json.loads((WORK / "hf" / family / "config.json").read_text()).get("vocab_size", 0))
    ids = np.random.default_rng(len(family)).integers(3, vocab, LENGTH).tolist()
    ours, formats = ortserve_logits(path, ids)
    theirs = llama_cpp_logits(path, ids)
    exact = transformers_logits(family, ids) if kind == "F32" else ortserve_logits(path, ids, "fp32")[0]
    row = dict(
        family=family,
        type=kind,
        formats=formats,
        diff=float(np.abs(ours - theirs).max()),
        ours_exact=float(np.abs(ours - exact).max()),
        llama_exact=float(np.abs(theirs - exact).max()),
        top1=float((ours.argmax(-1) == theirs.argmax(-1)).mean()),
    )
    if kind == "F32":  # llama.cpp's GELU is an fp16 lookup table: Gemma and GPT-2 move by ~4e-3
        row["ok"] = row["ours_exact"] <= EXACT_TOLERANCE and row["diff"] <= GELU_TOLERANCE
    else:
        row["ok"] = row["ours_exact"] <= NOISE_TOLERANCE * row["llama_exact"]
    return row


def write_table(rows: list[dict]) -> None:
    lines = [
        "## GGUF parity with llama.cpp",
        "",
        "`python benchmarks/gguf_parity.py`: tiny random checkpoints (2 layers, hidden 256) converted by "
        "llama.cpp's `convert_hf_to_gguf.py` and quantised by `llama-quantize`; logits at all 48 positions "
        "of one sequence, ortserve vs llama-cpp-python (`logits_all`, f32 KV cache). *exact*: for F32 files "
        "transformers' logits of the original checkpoint; for quantised files the same file's weights "
        "dequantised with fp32 activations (ortserve `--precision fp32`, tied to transformers by the F32 rows "
        "and to gguf's dequantiser bit for bit by tests/models/test_gguf_import.py). Tolerance: F32 ortserve "
        f"within {EXACT_TOLERANCE:g} of exact and {GELU_TOLERANCE:g} of llama.cpp (whose GELU is an fp16 lookup "
        "table: Gemma and GPT-2 move by ~4e-3); quantised: ortserve no further from exact than "
        f"{NOISE_TOLERANCE:g}x llama.cpp is (llama.cpp quantises activations to 8 bits; ortserve to 16, its Q6_K "
        "tensors too since op_version 11: with 8-bit ones through MatMulNBits before, the files with Q6_K "
        "tensors were 4e-2 to 7e-2 from exact, now about 1.5e-3).",
        "",
        "| family | GGUF | ortserve stores | max abs diff ortserve - llama.cpp | ortserve - exact | llama.cpp - exact "
        "| top-1 agreement | within tolerance |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        stored = ", ".join(f"{k} x{v}" for k, v in sorted(r["formats"].items()))
        lines.append(
            f"| {r['family']} | {r['type']} | {stored} | {r['diff']:.2e} | {r['ours_exact']:.2e} | "
            f"{r['llama_exact']:.2e} | {r['top1']:.0%} | {'yes' if r['ok'] else 'NO'} |"
        )
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    TABLE.write_text("\n".join(lines) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    parser.add_argument("--types", nargs="+", default=list(TYPES), choices=TYPES)
    args = parser.parse_args()
    if not all((WORK / "hf" / family / "config.json").is_file() for family in FAMILIES):
        from ortserve.models import BUILTIN_MODELS, DEFAULT_MODEL, gguf_checkpoint

        smollm2 = gguf_checkpoint(BUILTIN_MODELS[DEFAULT_MODEL].gguf_path(), progress=False)
        peer("checkpoints", str(WORK / "hf"), str(smollm2))
    rows = []
    for family in args.families:
        for kind, path in gguf_files(family, args.types).items():
            rows.append(compare(family, kind, path))
            r = rows[-1]
            print(
                f"{family:8s} {kind:7s} |ours-llama| {r['diff']:.2e} |ours-exact| {r['ours_exact']:.2e} "
                f"|llama-exact| {r['llama_exact']:.2e} top-1 {r['top1']:.0%} {'ok' if r['ok'] else 'FAIL'}"
            )
    write_table(rows)
    print(f"wrote {TABLE}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
