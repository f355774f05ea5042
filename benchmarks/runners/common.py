"""What every runner shares: workloads, models, paths, records, server processes, the bench."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from runners.neighbours import Meter

BENCH_DIR = Path(__file__).resolve().parent.parent
RESULTS = BENCH_DIR / "results"
# One folder of records per kind of machine: compare/avx2-amd-zen3/, compare/avx-512-vnni-bf16-intel/.
COMPARE = RESULTS / "compare"
PEER_MODELS = RESULTS / "peer-models"
PEERS_VENV = Path(os.environ.get("PEERS_VENV", BENCH_DIR / ".venv-peers"))
PEERS_PY = PEERS_VENV / "bin" / "python"
LLAMA_BIN = PEERS_VENV / "build-llama.cpp" / "bin"


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # decode | prefill | serve | shared-prefix | grounded
    input_len: int
    output_len: int
    concurrency: int
    num_prompts: int
    prefix_len: int = 0


WORKLOADS = {
    w.name: w
    for w in [
        Workload("decode", "decode", 128, 128, 1, 3),
        Workload("prefill", "prefill", 512, 1, 1, 3),
        *[Workload(f"serve-c{c}", "serve", 128, 128, c, max(4, 2 * c)) for c in (1, 4, 16, 32)],
        Workload("shared-prefix", "shared-prefix", 512, 32, 4, 16, prefix_len=448),
        # copy or correct a ~256-token passage, one request at a time, stopping on its own: the
        # input-grounded text where prompt-lookup speculation pays (ortserve.bench.dataset)
        Workload("grounded", "grounded", 256, 320, 1, 4),
    ]
}


@dataclass(frozen=True)
class Model:
    name: str
    hf_dir: Path

    @property
    def tokenizer_dir(self) -> Path:
        return self.hf_dir


def load_model(name: str) -> Model:
    if name == "smollm2-135m":
        from ortserve.models import prepare_checkpoint

        return Model(name, Path(prepare_checkpoint("smollm2-135m-instruct", progress=False)))
    if name in QWEN_SHAPES:
        out = RESULTS / "models" / name
        if not (out / "config.json").is_file():
            run_logged(
                [sys.executable, str(BENCH_DIR / "make_qwen_shape.py"), "--model", name, "--out", str(out)],
                RESULTS / "logs" / f"make_{name}.log",
            )
        return Model(name, out)
    raise SystemExit(f"unknown model {name!r}: one of {', '.join(MODELS)}")


QWEN_SHAPES = ("qwen2.5-0.5b-shape", "qwen2.5-1.5b-shape")  # random weights, built by make_qwen_shape.py
MODELS = ("smollm2-135m", *QWEN_SHAPES)
DEFAULT_MODELS = MODELS[:2]  # the targets' models (RESULTS.md); the 1.5B shape (mostly Q4_K) on request


# ---- records -------------------------------------------------------------------------------


def cpu_flags() -> list[str]:
    """The SIMD features this machine's CPU has that the kernels choose between."""
    flags = open("/proc/cpuinfo").read()
    return [f for f in ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile") if f" {f}" in flags]


def kernel_isa() -> str:
    """The widest SIMD the CPU of this run has, as every row of RESULTS.md names it."""
    flags = cpu_flags()
    if "avx512_vnni" in flags:
        return "AVX-512+VNNI" + ("+BF16" if "avx512_bf16" in flags else "")
    return "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"


def cpu_vendor() -> str:
    """AMD or Intel: two CPUs with the same ISA (an AVX-512 Zen and an AVX-512 Xeon) are two kinds of
    machine, with their own caches, memory and peers' kernels."""
    vendor = re.search(r"vendor_id\s*:\s*(\S+)", open("/proc/cpuinfo").read())
    return {"AuthenticAMD": "AMD", "GenuineIntel": "Intel"}.get(vendor[1] if vendor else "", "other")


# AMD's core generations by CPU family (and, in family 25, by AVX-512: Zen 4 has it, Zen 3 not).
AMD_GENERATIONS = {23: "Zen 2", 25: "Zen 3", 26: "Zen 5"}


def cpu_generation() -> str:
    """An AMD CPU's core generation ('Zen 4'), empty for other vendors: two AVX-512 EPYCs of different
    generations (Zen 4's 256-bit units, Zen 5's 512-bit ones) are two kinds of machine."""
    info = open("/proc/cpuinfo").read()
    family = re.search(r"cpu family\s*:\s*(\d+)", info)
    if cpu_vendor() != "AMD" or family is None:
        return ""
    if int(family[1]) == 25 and "avx512f" in cpu_flags():
        return "Zen 4"
    return AMD_GENERATIONS.get(int(family[1]), f"family {family[1]}")


def machine_folder(isa: str, vendor: str, generation: str = "") -> Path:
    """Where the records of runs on one kind of machine live: a run replaces only its own kind's."""
    kind = f"{isa}-{vendor}" + (f"-{generation}" if generation else "")
    return COMPARE / kind.lower().replace("+", "-").replace(" ", "")


# $ORTSERVE_BENCH_RECORDS puts a run's records elsewhere: avx2_proxy.py's runs of AVX2 code on a
# wider CPU must not replace that CPU's own records.
RECORDS = Path(os.environ.get("ORTSERVE_BENCH_RECORDS") or machine_folder(kernel_isa(), cpu_vendor(), cpu_generation()))


def record_path(model: str, system: str, precision: str, workload: str) -> Path:
    return RECORDS / model / f"{system}--{precision}" / f"{workload}.json"


def read_bandwidth() -> float:
    """The machine's read bandwidth now, GB/s: the best of membw.py's read and read4 on 1 and 2
    threads over 0.5 GiB arrays."""
    import membw

    bw = membw.measure(0.5, [1, 2], 3)["threads"]
    return float(max(v for t in bw.values() for k, v in t.items() if k.startswith("read")))


def record(
    model: str,
    system: str,
    precision: str,
    workload: Workload,
    metrics: dict,
    command: str,
    raw: Path | None = None,
    notes: str = "",
) -> dict:
    """Save one result. A decode result also gets the read bandwidth of the machine around it and
    the weight bytes its system reads per token. On a shared host the bandwidth swings by 2x with
    the neighbours' load within minutes, so it is measured right after the run and, where the run
    went through `bench_serve`, right before it too; the roofline takes the larger (the stricter)."""
    if workload.kind == "decode":
        from report import weight_bytes

        metrics["bandwidth_after_GBps"] = read_bandwidth()
        metrics["bandwidth_GBps"] = max(metrics["bandwidth_after_GBps"], metrics.get("bandwidth_before_GBps") or 0.0)
        metrics["weight_bytes"] = weight_bytes(system, precision, model)  # the files may be gone at report time
    rec = dict(
        model=model,
        system=system,
        precision=precision,
        workload=workload.name,
        workload_spec=asdict(workload),
        metrics=metrics,
        command=command,
        raw=str(raw.relative_to(BENCH_DIR)) if raw else None,
        notes=notes,
        neighbour_cpu_share=round(METER.share(), 3),
        isa=kernel_isa(),
        when=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    path = record_path(model, system, precision, workload.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    if KEEP_BEST and path.is_file():  # a repeat round: keep the better attempt, remember them all
        old = json.loads(path.read_text())
        key = PRIMARY[workload.kind]
        tries = old.get("attempts", [old["metrics"].get(key)]) + [metrics.get(key)]
        if (old["metrics"].get(key) or 0) >= (metrics.get(key) or 0):
            rec = old
        rec["attempts"] = tries
    path.write_text(json.dumps(rec, indent=1))
    METER.mark()
    return {**rec, "this_attempt": metrics}


# Other tenants' CPU share since the last record (or since compare.py marked the start of a system).
METER = Meter()

# The number a repeat round compares attempts by; set KEEP_BEST for rounds after the first.
PRIMARY = {
    "decode": "decode_tok_s",
    "prefill": "prompt_tok_s",
    "serve": "output_throughput",
    "shared-prefix": "output_throughput",
    "grounded": "output_throughput",
}
KEEP_BEST = False


def load_records(folder: Path = RECORDS) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*/*/*.json"))]


def wait_idle(max_load: float, timeout: float) -> float:
    """Wait (up to timeout s) until the 1-minute load average is below max_load; return it."""
    deadline = time.monotonic() + timeout
    while (load := os.getloadavg()[0]) >= max_load and time.monotonic() < deadline:
        time.sleep(10)
    return load


# ---- processes -----------------------------------------------------------------------------


def run_logged(
    argv: list[str], log: Path, env: dict | None = None, timeout: float | None = None, ok_codes: tuple[int, ...] = (0,)
) -> None:
    """Run argv to completion, output to log; raise with the log's tail on failure."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        f.write("$ " + shlex.join(argv) + "\n")
        f.flush()
        code = subprocess.run(
            argv, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}, timeout=timeout
        ).returncode
    if code not in ok_codes:
        raise RuntimeError(
            f"{shlex.join(argv[:3])}... exited {code}; last lines of {log}:\n"
            + "".join(log.read_text().splitlines(True)[-15:])
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on 127.0.0.1: started in its own session, healthy when `health` answers
    200, stopped with SIGTERM (then SIGKILL) of its whole process group."""

    def __init__(self, argv: list[str], port: int, log: Path, env: dict | None = None, ready_timeout: float = 900):
        import httpx

        self.base_url = f"http://127.0.0.1:{port}"
        self.command = shlex.join(argv)
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log, "w")
        self._log.write("$ " + self.command + "\n")
        self._log.flush()
        self.proc = subprocess.Popen(
            argv, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **(env or {})}
        )
        deadline = time.monotonic() + ready_timeout
        while True:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(
                    f"server exited ({self.proc.returncode}); see {log}:\n"
                    + "".join(log.read_text().splitlines(True)[-15:])
                )
            try:
                if httpx.get(self.base_url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"server not healthy after {ready_timeout:.0f}s; see {log}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


# ---- the serving benchmark -----------------------------------------------------------------


def bench_serve(
    base_url: str, model_name: str, model: Model, workload: Workload, out: Path, backend: str = "openai", seed: int = 0
) -> tuple[dict, str]:
    """`ortserve bench serve` for one workload; returns (its JSON record, the command)."""
    argv = [
        sys.executable,
        "-m",
        "ortserve.cli",
        "bench",
        "serve",
        "--base-url",
        base_url,
        "--model",
        model_name,
        "--backend",
        backend,
        "--tokenizer",
        str(model.tokenizer_dir),
        "--dataset",
        workload.kind if workload.kind in ("shared-prefix", "grounded") else "random",
        "--num-prompts",
        str(workload.num_prompts),
        "--max-concurrency",
        str(workload.concurrency),
        "--input-len",
        str(workload.input_len),
        "--output-len",
        str(workload.output_len),
        "--percentiles",
        "50,99",
        "--seed",
        str(seed),
        "--disable-tqdm",
        "--result-json",
        str(out),
    ]
    if workload.kind == "shared-prefix":
        argv += ["--prefix-len", str(workload.prefix_len)]
    out.unlink(missing_ok=True)
    before = read_bandwidth() if workload.kind == "decode" else None  # the roofline's (record)
    run_logged(argv, out.with_suffix(".log"), ok_codes=(0, 1))  # 1: some requests failed; the record says so
    if not out.is_file():
        raise RuntimeError(f"ortserve bench serve wrote no result; see {out.with_suffix('.log')}")
    result = json.loads(out.read_text())
    if before is not None:
        result["bandwidth_before_GBps"] = before
    return result, shlex.join(["ortserve", *argv[3:]])


def serve_metrics(bench: dict, workload: Workload) -> dict:
    """The numbers RESULTS.md reports, from one `ortserve bench serve` record."""
    m = {
        "completed": bench["completed"],
        "failed": bench["failed"],
        "output_throughput": bench["output_throughput"],
        "total_token_throughput": bench["total_token_throughput"],
        "ttft_p50_ms": bench["median_ttft_ms"],
        "ttft_p99_ms": bench["p99_ttft_ms"],
        "tpot_p50_ms": bench["median_tpot_ms"],
        "itl_p50_ms": bench["median_itl_ms"],
        "e2el_p50_ms": bench["median_e2el_ms"],
        "mean_input_len": float(np.mean(bench["input_lens"])),
        "mean_output_len": float(np.mean(bench["output_lens"])) if bench.get("output_lens") else None,
        "server_counters_delta": bench.get("server_counters_delta", {}),
    }
    if workload.kind in ("decode", "prefill"):
        m["prompt_tok_s"] = workload.input_len / (bench["median_ttft_ms"] / 1000)
    if workload.kind == "decode":
        m["decode_tok_s"] = 1000 / bench["median_tpot_ms"]
        if "bandwidth_before_GBps" in bench:
            m["bandwidth_before_GBps"] = bench["bandwidth_before_GBps"]
    return m


# ---- prompts for in-process peers ------------------------------------------------------------


def token_prompts(model: Model, workload: Workload, seed: int = 0) -> list[list[int]]:
    """The same kind of prompts `ortserve bench serve` sends, as token ids."""
    from ortserve.bench.dataset import PromptMaker, bench_tokenizer

    maker = PromptMaker(bench_tokenizer(model.tokenizer_dir))
    rng = np.random.default_rng(seed)
    if workload.kind == "shared-prefix":
        prefix = maker.tokens(workload.prefix_len, rng)
        return [
            prefix + maker.tokens(workload.input_len - workload.prefix_len, rng) for _ in range(workload.num_prompts)
        ]
    return [maker.tokens(workload.input_len, rng) for _ in range(workload.num_prompts)]


def distribution_ms(seconds: list[float]) -> tuple[float, float]:
    """(p50, p99) in ms, numpy percentiles as in the bench."""
    a = np.asarray(seconds, dtype=np.float64) * 1000
    return float(np.median(a)), float(np.percentile(a, 99))
