"""AVX2 code on a wider CPU: ortserve's AVX2 kernels beside llama.cpp's AVX2 build, int4.

Between visits of an AVX2 machine, this is how the AVX2 code paths get tuned. On an AVX-512 CPU it
times, in one run, one after the other:
  - ortserve's int4 graph (`bench_graph.py`: batch-1 decode at context 128, 512-token prefill) with
    `ORTSERVE_KERNEL_ISA=avx2` and with the native kernels;
  - `llama-bench` (tg128, pp512) on the same model's Q4_0 GGUF, with llama.cpp's native ggml-cpu and
    with one built for AVX2 + FMA + F16C only (no AVX-512, no AVX-VNNI: what Zen 3 has), which this
    script builds once (ggml-cpu alone, ~3 min) and loads through LD_LIBRARY_PATH.

Then, unless --no-served, the same comparison served: `compare.py` (ortserve, ortserve-a8 and
llama.cpp; decode, prefill 512 and serve-c16; int4) with both capped the same way, its records in
results/avx2-proxy/ ($ORTSERVE_BENCH_RECORDS), apart from this CPU's own (~15 min).

What it cannot stand in for: onnxruntime's own kernels (fp32 MatMul, layer norms) keep the full
width, so only int4 is compared; and the caches and memory are this machine's. It predicts the
ratios of the next AVX2 `compare.py` run; it does not replace them.

    python benchmarks/avx2_proxy.py [--rounds 3] [--no-served]     # -> tables/avx2_proxy.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from runners import llamacpp, ortserve_runner
from runners.common import BENCH_DIR, LLAMA_BIN, MODELS, PEERS_VENV, RESULTS, kernel_isa, load_model, load_records

AVX2_BUILD = PEERS_VENV / "build-llama.cpp-avx2"
TABLE = BENCH_DIR / "tables" / "avx2_proxy.md"
SERVED_RECORDS = RESULTS / "avx2-proxy"
SERVED_SYSTEMS = ("ortserve", "ortserve-a8", "llama.cpp")
SERVED_METRIC = {"decode": "decode_tok_s", "prefill": "prompt_tok_s", "serve-c16": "output_throughput"}
AVX2_ONLY = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON"]
AVX2_ONLY += ["-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF"]


def avx2_ggml() -> Path:
    """The folder of a libggml-cpu.so built for AVX2 only, from the peers' llama.cpp tree."""
    lib = AVX2_BUILD / "bin" / "libggml-cpu.so"
    if lib.is_file():
        return lib.parent
    source = sorted(PEERS_VENV.glob("src/llama_cpp_python-*/vendor/llama.cpp"))
    if not source:
        raise SystemExit("llama.cpp's source not found: run bash benchmarks/peers/setup.sh")
    cmake = str(PEERS_VENV / "bin" / "cmake")
    configure = [cmake, "-S", str(source[-1]), "-B", str(AVX2_BUILD), "-DCMAKE_BUILD_TYPE=Release"]
    configure += ["-DBUILD_SHARED_LIBS=ON", *AVX2_ONLY, "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]
    subprocess.run(configure, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["nice", "-n", "10", cmake, "--build", str(AVX2_BUILD), "-j", "2", "--target", "ggml-cpu"], check=True
    )
    return lib.parent


def llama_bench(gguf: Path, ggml_dir: Path | None, rounds: int) -> dict[str, float]:
    """tok/s of llama-bench's tg128 and pp512 at 2 threads; ggml_dir: a ggml-cpu to load instead."""
    env = dict(os.environ)
    if ggml_dir is not None:
        env["LD_LIBRARY_PATH"] = str(ggml_dir)
    argv = [str(LLAMA_BIN / "llama-bench"), "-m", str(gguf), "-t", "2", "-p", "512", "-n", "128"]
    out = subprocess.run([*argv, "-r", str(rounds), "-o", "json"], env=env, capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    return {
        "decode": next(r["avg_ts"] for r in rows if r["n_gen"] > 0),
        "prefill": next(r["avg_ts"] for r in rows if r["n_prompt"] > 0),
    }


def ortserve_graph(artifact: Path, isa: str | None, rounds: int) -> dict[str, float]:
    """tok/s of bench_graph.py's decode and prefill at 2 threads; isa: ORTSERVE_KERNEL_ISA."""
    env = {k: v for k, v in os.environ.items() if k != "ORTSERVE_KERNEL_ISA"}
    if isa:
        env["ORTSERVE_KERNEL_ISA"] = isa
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "graph.json"
        argv = [sys.executable, str(BENCH_DIR / "bench_graph.py"), "--artifact", f"a={artifact}", "--no-genai"]
        argv += ["--no-build", "--threads", "2", "--steps", "100", "--rounds", str(rounds), "--precision", "int4"]
        subprocess.run([*argv, "--no-roofline", "--out", str(out)], env=env, check=True, stdout=subprocess.DEVNULL)
        result = json.loads(out.read_text())["precisions"]["int4"]["results"]["a"]
    return {"decode": result["decode_tok_s"], "prefill": result["prefill_tok_s"]}


def served(models: list[str], ggml_dir: Path) -> list[str]:
    """compare.py's int4 decode, prefill and serve-c16 with AVX2 code on both sides: table rows."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(ggml_dir), "ORTSERVE_KERNEL_ISA": "avx2"}
    env["ORTSERVE_BENCH_RECORDS"] = str(SERVED_RECORDS)
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, str(BENCH_DIR / "compare.py"), "--force", "--systems", *SERVED_SYSTEMS]
        argv += ["--workloads", *SERVED_METRIC, "--precisions", "int4", "--models", *models]
        subprocess.run([*argv, "--results-md", str(Path(tmp) / "RESULTS.md")], env=env, check=True)
    found = {(r["model"], r["system"], r["workload"]): r["metrics"] for r in load_records(SERVED_RECORDS)}
    rows = []
    for model in models:
        for workload, metric in SERVED_METRIC.items():
            m = {system: found[(model, system, workload)] for system in SERVED_SYSTEMS}
            tok_s = [m[system][metric] for system in SERVED_SYSTEMS]
            ttft = " / ".join(f"{m[system]['ttft_p50_ms']:,.0f}" for system in SERVED_SYSTEMS)
            ratios = f"{tok_s[0] / tok_s[2]:.2f} | {tok_s[1] / tok_s[2]:.2f}"
            rows.append(f"| {model} | {workload} | {' | '.join(f'{v:,.1f}' for v in tok_s)} | {ratios} | {ttft} |")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--no-served", action="store_true", help="the graphs only, not compare.py's served runs")
    args = p.parse_args()
    cpu = kernel_isa()
    if not cpu.startswith("AVX-512"):
        raise SystemExit(f"this CPU is {cpu}: run compare.py itself, not a proxy")
    ggml_avx2 = avx2_ggml()
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    rows = []
    for name in args.models:
        model = load_model(name)
        gguf, artifact = llamacpp.gguf(model, "int4"), ortserve_runner.artifact(model, "int4")
        ours = {"AVX2": ortserve_graph(artifact, "avx2", args.rounds), cpu: ortserve_graph(artifact, None, args.rounds)}
        theirs = {"AVX2": llama_bench(gguf, ggml_avx2, args.rounds), cpu: llama_bench(gguf, None, args.rounds)}
        for isa in ("AVX2", cpu):
            for workload in ("decode", "prefill"):
                a, b = ours[isa][workload], theirs[isa][workload]
                rows.append(f"| {name} | {isa} code | {workload} | {a:,.1f} | {b:,.1f} | {a / b:.2f} |")
        print("\n".join(rows[-4:]), flush=True)
    head = [
        "## AVX2 code paths on an AVX-512 CPU (a proxy for the next AVX2 machine)",
        "",
        f"`python benchmarks/avx2_proxy.py` on {cpu}, {started} UTC, 2 threads: int4 tok/s, ortserve's graph",
        "(`bench_graph.py`: median decode step at context 128, median 512-token prefill) with its kernels capped at",
        "AVX2 (`ORTSERVE_KERNEL_ISA=avx2`) or native, beside `llama-bench` (tg128, pp512) on the Q4_0 GGUF with",
        "a ggml-cpu built for AVX2 + FMA + F16C only or the native one. onnxruntime's own kernels (layer norms)",
        "keep the full width; the memory system is this machine's.",
        "",
        "| model | code | workload | ortserve int4 | llama.cpp Q4_0 | ratio |",
        "|---|---|---|---:|---:|---:|",
    ]
    lines = head + rows
    if not args.no_served:
        lines += [
            "",
            "Served, `compare.py` with the same two caps (`ORTSERVE_KERNEL_ISA=avx2`, the AVX2 ggml-cpu), records in",
            "`results/avx2-proxy/`: decode and prefill tok/s, serve-c16 output tok/s; ortserve is the default",
            "16-bit activations, ortserve-a8 `--activation-bits 8` (llama.cpp's rounding).",
            "",
            "| model | workload | ortserve | ortserve-a8 | llama.cpp | ortserve ÷ llama.cpp | a8 ÷ llama.cpp "
            "| TTFT p50 ms (same order) |",
            "|---|---|---:|---:|---:|---:|---:|---|",
            *served(args.models, ggml_avx2),
        ]
    TABLE.write_text("\n".join(lines) + "\n")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
