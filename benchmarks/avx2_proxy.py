"""AVX2 code on a wider CPU: ortserve beside llama.cpp, both limited to AVX2, int4 and fp32.

Between visits of an AVX2 machine, this is how the AVX2 code paths get tuned. On an AVX-512 CPU,
every ortserve and llama.cpp process of this script runs AVX2 code only:
  - ortserve: `peers/cpuid_no_avx512.c`, LD_PRELOADed, hides AVX-512, AVX-VNNI and AMX from CPUID
    (Linux's CPUID faulting), so onnxruntime's MLAS and our op library pick their AVX2 kernels
    (`ORTSERVE_KERNEL_ISA=avx2` as well);
  - llama.cpp: its ggml-cpu built for AVX2 + FMA + F16C only (what Zen 3 has; no AVX-512, no
    AVX-VNNI), which this script builds once (~3 min) and loads through LD_LIBRARY_PATH.
It measures, in one run, one after the other:
  - the graphs: ortserve's (`bench_graph.py`: median decode step at context 128, median
    512-token prefill) and `llama-bench` (tg128, pp512) on the same model's GGUF, int4 and fp32,
    each both AVX2-limited and native;
  - unless --no-served, the same served: `compare.py` (ortserve, ortserve-a8 and llama.cpp;
    decode, prefill 512 and serve-c16) AVX2-limited, its records in results/avx2-proxy/
    ($ORTSERVE_BENCH_RECORDS), apart from this CPU's own (~30 min).

What it cannot stand in for: the caches, the memory and the cores are this machine's. It predicts
the ratios of the next AVX2 `compare.py` run; it does not replace them.

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
from runners.common import (
    BENCH_DIR,
    DEFAULT_MODELS,
    LLAMA_BIN,
    MODELS,
    PEERS_VENV,
    RESULTS,
    kernel_isa,
    load_model,
    load_records,
)

AVX2_BUILD = PEERS_VENV / "build-llama.cpp-avx2"
SHIM = PEERS_VENV / "build-cpuid" / "libcpuid_no_avx512.so"
TABLE = BENCH_DIR / "tables" / "avx2_proxy.md"
PRECISIONS = ("int4", "fp32")
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


def cpuid_shim() -> Path:
    """peers/cpuid_no_avx512.c, compiled once."""
    source = BENCH_DIR / "peers" / "cpuid_no_avx512.c"
    if not SHIM.is_file() or SHIM.stat().st_mtime < source.stat().st_mtime:
        SHIM.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cc", "-O2", "-shared", "-fPIC", str(source), "-o", str(SHIM)], check=True)
    return SHIM


def avx2_env() -> dict[str, str]:
    """The environment of an AVX2-limited run: every child process inherits it."""
    env = {**os.environ, "LD_PRELOAD": str(cpuid_shim())}
    check = "from numpy._core._multiarray_umath import __cpu_features__ as f; print(f['AVX512F'], f['AVX2'])"
    seen = subprocess.run([sys.executable, "-c", check], env=env, capture_output=True, text=True, check=True)
    if seen.stdout.split() != ["False", "True"]:  # checked before the AVX2 build of ggml, which takes minutes
        raise SystemExit(
            "the CPUID shim did not hide AVX-512 (numpy still sees it). It needs the kernel's CPUID faulting, "
            "which some guests lack (AMD EPYC VMs here: 'arch_prctl(ARCH_SET_CPUID): No such device'). "
            f"Run this on another machine, or compare.py on an AVX2 one.\n{seen.stdout}{seen.stderr}"
        )
    return {**env, "LD_LIBRARY_PATH": str(avx2_ggml()), "ORTSERVE_KERNEL_ISA": "avx2"}


def native_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH", "ORTSERVE_KERNEL_ISA")}


def llama_bench(gguf: Path, env: dict[str, str], rounds: int) -> dict[str, float]:
    """tok/s of llama-bench's tg128 and pp512 at 2 threads."""
    argv = [str(LLAMA_BIN / "llama-bench"), "-m", str(gguf), "-t", "2", "-p", "512", "-n", "128"]
    out = subprocess.run([*argv, "-r", str(rounds), "-o", "json"], env=env, capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    return {
        "decode": next(r["avg_ts"] for r in rows if r["n_gen"] > 0),
        "prefill": next(r["avg_ts"] for r in rows if r["n_prompt"] > 0),
    }


def ortserve_graph(artifact: Path, precision: str, env: dict[str, str], rounds: int) -> dict[str, float]:
    """tok/s of bench_graph.py's decode and prefill at 2 threads."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "graph.json"
        argv = [sys.executable, str(BENCH_DIR / "bench_graph.py"), "--artifact", f"a={artifact}", "--no-genai"]
        argv += ["--no-build", "--threads", "2", "--steps", "100", "--rounds", str(rounds), "--precision", precision]
        subprocess.run([*argv, "--no-roofline", "--out", str(out)], env=env, check=True, stdout=subprocess.DEVNULL)
        result = json.loads(out.read_text())["precisions"][precision]["results"]["a"]
    return {"decode": result["decode_tok_s"], "prefill": result["prefill_tok_s"]}


def graphs(models: list[str], cpu: str, avx2: dict[str, str], rounds: int) -> list[str]:
    """Table rows: each model and precision, AVX2-limited (env avx2) and native, ortserve beside llama.cpp."""
    rows = []
    for name in models:
        model = load_model(name)
        for precision in PRECISIONS:
            gguf, artifact = llamacpp.gguf(model, precision), ortserve_runner.artifact(model, precision)
            for label, env in (("AVX2", avx2), (cpu, native_env())):
                ours, theirs = ortserve_graph(artifact, precision, env, rounds), llama_bench(gguf, env, rounds)
                for workload in ("decode", "prefill"):
                    a, b = ours[workload], theirs[workload]
                    rows.append(
                        f"| {name} | {precision} | {label} code | {workload} | {a:,.1f} | {b:,.1f} | {a / b:.2f} |"
                    )
                print("\n".join(rows[-2:]), flush=True)
    return rows


def served(models: list[str], avx2: dict[str, str]) -> list[str]:
    """compare.py's decode, prefill and serve-c16, AVX2-limited (env avx2) on both sides: table rows."""
    env = {**avx2, "ORTSERVE_BENCH_RECORDS": str(SERVED_RECORDS)}
    with tempfile.TemporaryDirectory() as tmp:
        argv = [sys.executable, str(BENCH_DIR / "compare.py"), "--force", "--systems", *SERVED_SYSTEMS]
        argv += ["--workloads", *SERVED_METRIC, "--precisions", *PRECISIONS, "--models", *models]
        subprocess.run([*argv, "--results-md", str(Path(tmp) / "RESULTS.md")], env=env, check=True)
    found = {
        (r["model"], r["system"], r["precision"], r["workload"]): r["metrics"] for r in load_records(SERVED_RECORDS)
    }
    rows = []
    for model in models:
        for precision in PRECISIONS:
            for workload, metric in SERVED_METRIC.items():
                m = {s: found.get((model, s, precision, workload)) for s in SERVED_SYSTEMS}
                ours, a8, theirs = (m[s][metric] if m[s] else None for s in SERVED_SYSTEMS)
                cells = [f"{v:,.1f}" if v else "–" for v in (ours, a8, theirs)]
                ratios = [f"{v / theirs:.2f}" if v and theirs else "–" for v in (ours, a8)]
                ttft = " / ".join(f"{m[s]['ttft_p50_ms']:,.0f}" for s in SERVED_SYSTEMS if m[s])
                rows.append(f"| {model} | {precision} | {workload} | {' | '.join(cells + ratios)} | {ttft} |")
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(MODELS))
    p.add_argument("--no-served", action="store_true", help="the graphs only, not compare.py's served runs")
    args = p.parse_args()
    cpu = kernel_isa()
    if not cpu.startswith("AVX-512"):
        raise SystemExit(f"this CPU is {cpu}: run compare.py itself, not a proxy")
    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M")
    avx2 = avx2_env()
    lines = [
        "## AVX2 code paths on an AVX-512 CPU (a proxy for the next AVX2 machine)",
        "",
        f"`python benchmarks/avx2_proxy.py` on {cpu}, {started} UTC, 2 threads. 'AVX2 code': ortserve with",
        "AVX-512, AVX-VNNI and AMX hidden from CPUID (`peers/cpuid_no_avx512.c`, LD_PRELOAD: onnxruntime's MLAS",
        "and our kernels take their AVX2 paths), llama.cpp with a ggml-cpu built for AVX2 + FMA + F16C only.",
        "Graphs: ortserve's `bench_graph.py` (median decode step at context 128, median 512-token prefill)",
        "beside `llama-bench` (tg128, pp512) on the same model's GGUF (Q4_0 for int4, F32 for fp32), tok/s.",
        "The caches, memory and cores are this machine's.",
        "",
        "| model | precision | code | workload | ortserve | llama.cpp | ratio |",
        "|---|---|---|---|---:|---:|---:|",
        *graphs(args.models, cpu, avx2, args.rounds),
    ]
    if not args.no_served:
        lines += [
            "",
            "Served, AVX2 code on both sides: `compare.py`, records in `results/avx2-proxy/`. Decode and prefill",
            "tok/s, serve-c16 output tok/s; ortserve is the default 16-bit activations, ortserve-a8",
            "`--activation-bits 8` (llama.cpp's rounding; int4 only).",
            "",
            "| model | precision | workload | ortserve | ortserve-a8 | llama.cpp | ortserve ÷ llama.cpp "
            "| a8 ÷ llama.cpp | TTFT p50 ms (same order) |",
            "|---|---|---|---:|---:|---:|---:|---:|---|",
            *served(args.models, avx2),
        ]
    TABLE.write_text("\n".join(lines) + "\n")
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
