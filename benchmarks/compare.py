"""Run ortserve and its peers side by side on this machine and write benchmarks/RESULTS.md.

    python benchmarks/compare.py [--systems ...] [--models ...] [--workloads ...] [--precisions ...]
                                 [--force] [--report-only]

Systems: ortserve, llama.cpp, genai-static, genai-engine, transformers (peers need
`bash benchmarks/peers/setup.sh` first). Models: smollm2-135m (real weights),
qwen2.5-0.5b-shape (random, built by make_qwen_shape.py; the default two), qwen2.5-1.5b-shape (random,
its widths multiples of 256, so that llama-quantize's Q4_K_M file is Q4_K and Q6_K). Workloads: decode, prefill,
serve-c1, serve-c4, serve-c16, serve-c32, shared-prefix.

Resumable: each (model, system, precision, workload) result is a record under
benchmarks/results/compare/<isa>/ (one folder per kind of CPU: a run on an AVX2 machine replaces
only AVX2 records); existing records are skipped unless --force, so a long run can be stopped and
picked up, or done in parts. The report covers every record on disk, one part per ISA.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import membw
import report
from runners import RUNNERS, common
from runners.common import (
    BENCH_DIR,
    DEFAULT_MODELS,
    MODELS,
    PEERS_PY,
    RECORDS,
    WORKLOADS,
    cpu_flags,
    cpu_generation,
    load_model,
    record_path,
    wait_idle,
)

from ortserve.artifact import PRECISIONS

PEER_SYSTEMS = {"llama.cpp", "genai-static", "genai-engine", "transformers"}


def versions() -> dict:
    v = {"python": sys.version.split()[0]}
    for name in ("onnxruntime", "transformers"):
        try:
            v[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    v["ortserve"] = (
        subprocess.run(
            ["git", "-C", str(BENCH_DIR), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "?"
    )
    if PEERS_PY.exists():
        out = subprocess.run(
            [
                str(PEERS_PY),
                "-c",
                "import importlib.metadata as m;"
                "print(m.version('onnxruntime-genai'), m.version('llama_cpp_python'), m.version('torch'))",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        if len(out) == 3:
            v.update(
                {"onnxruntime-genai": out[0], "llama.cpp (llama-cpp-python sdist)": out[1], "torch (peers)": out[2]}
            )
    return v


def machine(force: bool) -> dict:
    path = RECORDS / "machine.json"
    if path.is_file() and not force:
        return json.loads(path.read_text())
    print("measuring memory bandwidth (benchmarks/membw.py)...", flush=True)
    info = {"membw": membw.measure(2.0, [1, 2], 5), "versions": versions(), "cpu_flags": cpu_flags()}
    info["cpu"] = report.cpu_lines()
    info["generation"] = cpu_generation()
    info["ram"] = next(line.split(":")[1].strip() for line in open("/proc/meminfo") if line.startswith("MemTotal"))
    info["kernel"] = platform.release()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(info, indent=1))
    return info


def write_run(started: str, failures: list[str], forced_all: bool, stopped: str | None = None) -> None:
    """Remember the commands that made the records, for RESULTS.md's *Reproduce* section: a run
    that re-measured everything (--force over every part) starts the list afresh. A run stopped
    with Ctrl-C (or SIGINT) is remembered with the round it reached: the records it wrote stay."""
    runs = [] if forced_all else recorded_runs()
    runs.append(
        {
            "command": " ".join(["python benchmarks/compare.py", *sys.argv[1:]]),
            "started": started,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "failures": failures,
            **({"stopped": stopped} if stopped else {}),
        }
    )
    (RECORDS / "run.json").write_text(json.dumps(runs, indent=1))


def recorded_runs() -> list[dict]:
    path = RECORDS / "run.json"
    return json.loads(path.read_text()) if path.is_file() else []


def summary(rec: dict) -> str:
    m = rec.get("this_attempt", rec["metrics"])
    keys = ("decode_tok_s", "prompt_tok_s", "output_throughput", "ttft_p50_ms")
    text = ", ".join(f"{k} {m[k]:.1f}" for k in keys if isinstance(m.get(k), (int, float)))
    return text + (f"  (kept: best of {len(rec['attempts'])})" if rec.get("attempts") else "")


def run_round(args, round_: int, failures: list[str]) -> None:
    """Every selected (model, system, precision) once, with the workloads still to do."""
    for model_name in args.models:
        model = load_model(model_name)
        for system in args.systems:
            runner = RUNNERS[system]
            for precision in [q for q in args.precisions if q in runner.PRECISIONS]:
                todo = [
                    w
                    for w in args.workloads
                    if w in runner.WORKLOADS_SUPPORTED
                    and (args.force or round_ > 0 or not record_path(model_name, system, precision, w).is_file())
                ]
                if not todo:
                    continue
                if args.wait_idle:
                    print(f"   (1-min load average {wait_idle(0.5, args.wait_idle):.2f})", flush=True)
                print(
                    f"== round {round_ + 1}/{args.repeat}: {model_name} / {system} {precision}: {' '.join(todo)}",
                    flush=True,
                )
                t0 = time.monotonic()
                common.METER.mark()
                try:
                    for rec in runner.run(model, precision, todo):
                        print(f"   {rec['workload']}: {summary(rec)}", flush=True)
                except Exception as exc:  # one system failing must not stop the others
                    failures.append(f"{model_name} / {system} {precision}: {exc}")
                    print(f"   FAILED: {exc}", flush=True)
                    traceback.print_exc()
                print(f"   ({time.monotonic() - t0:.0f} s)", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", default=list(RUNNERS), choices=list(RUNNERS))
    p.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(MODELS))
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--force", action="store_true", help="re-run parts that already have a record")
    p.add_argument("--remeasure-machine", action="store_true", help="re-run the bandwidth benchmark")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        metavar="N",
        help="run the selection N times, round robin over systems, and keep each part's best "
        "attempt (neighbours on a shared host only ever slow a run down)",
    )
    p.add_argument(
        "--wait-idle",
        type=float,
        default=0,
        metavar="SECONDS",
        help="before each system, wait up to this long for the 1-min load average to drop below 0.5 "
        "(the machine is shared; a busy neighbour skews every number)",
    )
    p.add_argument("--report-only", action="store_true", help="only rewrite RESULTS.md from the records")
    p.add_argument("--results-md", type=Path, default=BENCH_DIR / "RESULTS.md")
    args = p.parse_args()

    failures = []
    if not args.report_only:
        machine(args.remeasure_machine)
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        if PEER_SYSTEMS & set(args.systems) and not PEERS_PY.exists():
            print(f"peers venv missing ({PEERS_PY}): run `bash benchmarks/peers/setup.sh`; skipping peers")
            args.systems = [s for s in args.systems if s not in PEER_SYSTEMS]
        stopped = None
        try:
            for round_ in range(args.repeat):
                common.KEEP_BEST = round_ > 0
                run_round(args, round_, failures)
        except KeyboardInterrupt:
            stopped = f"stopped in round {round_ + 1} of {args.repeat}"
            print(f"\n{stopped}: the records written so far stay", flush=True)
        everything = all(
            set(getattr(args, f)) == set(p.get_default(f)) for f in ("systems", "models", "workloads", "precisions")
        )
        write_run(started, failures, forced_all=args.force and everything and not stopped, stopped=stopped)
    parts = report.isa_runs()
    report.write(args.results_md, parts)
    print(f"wrote {args.results_md} ({', '.join(f'{p.label}: {len(p.records)} records' for p in parts)})")
    for f in failures:
        print(f"failed: {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
