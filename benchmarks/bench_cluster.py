"""Per-replica throughput and routing overhead of `ortserve serve-cluster` (docs/scaling.md).

Three set-ups on the same artifact, each measured with `ortserve bench serve` (random prompts,
--input-len in, --output-len out, --concurrency in flight) and with a latency probe (sequential
requests of one output token, median of --probes):

  single     `ortserve serve --threads-bind 0`: one engine on one core, no Ray
  cluster-1  `serve-cluster --replicas 1 --cores-per-replica 1`: the same engine behind Ray Serve
  cluster-2  `serve-cluster --replicas 2 --cores-per-replica 1`: two replicas, one core each

routing overhead = probe(cluster-1) - probe(single): the Ray Serve proxy, the ingress, the request
router and the replica's forwarding, per request. Prints a Markdown table.

    python benchmarks/bench_cluster.py --model ~/.cache/ortserve/artifacts/smollm2-135m-instruct-int4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

LISTENING = re.compile(r"listening on (http://[\d.]+:\d+)")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(argv: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen, str]:
    out = log.open("w")
    proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, text=True)
    deadline = time.monotonic() + 600
    url = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{argv[3]} exited with {proc.returncode}; see {log}")
        url = url or next(iter(LISTENING.findall(log.read_text())), None)
        if url:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    return proc, url
            except httpx.HTTPError:
                pass
        time.sleep(0.5)
    raise SystemExit(f"not ready in 600 s; see {log}")


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(180)


def probe(url: str, model: str, count: int) -> float:
    """Median seconds of a one-token completion, sequentially."""
    times = []
    with httpx.Client(timeout=60) as client:
        for i in range(count + 2):
            body = {"model": model, "prompt": f"Probe {i}: hello", "max_tokens": 1, "temperature": 0}
            started = time.perf_counter()
            client.post(f"{url}/v1/completions", json=body).raise_for_status()
            if i >= 2:  # two warm-ups
                times.append(time.perf_counter() - started)
    return statistics.median(times)


def bench(url: str, args: argparse.Namespace, concurrency: int, work: Path) -> dict:
    result = work / f"bench-{time.monotonic_ns()}.json"
    subprocess.run(
        [sys.executable, "-m", "ortserve.cli", "bench", "serve", "--base-url", url, "--model", "bench",
         "--tokenizer", str(args.model), "--num-prompts", str(args.num_prompts), "--input-len", str(args.input_len),
         "--output-len", str(args.output_len), "--max-concurrency", str(concurrency), "--disable-tqdm",
         "--result-json", str(result)],
        check=True,
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True, help="an artifact directory")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8, help="per replica")
    parser.add_argument("--probes", type=int, default=20)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="osbench"))
    common = ["--served-model-name", "bench", "--kv-cache-space", "0.5"]
    cli = [sys.executable, "-m", "ortserve.cli"]
    setups = {
        "single": ([*cli, "serve", str(args.model), "--port", "0", "--threads-bind", "0", *common], 1),
        "cluster-1": ([*cli, "serve-cluster", str(args.model), "--replicas", "1", "--cores-per-replica", "1"], 1),
        "cluster-2": ([*cli, "serve-cluster", str(args.model), "--replicas", "2", "--cores-per-replica", "1"], 2),
    }
    rows = []
    for name, (argv, replicas) in setups.items():
        if name.startswith("cluster"):
            argv = [*argv, "--port", str(free_port()), *common]
        proc, url = start(argv, {"RAY_TMPDIR": str(work)}, work / f"{name}.log")
        try:
            latency = probe(url, "bench", args.probes)
            record = bench(url, args, args.concurrency * replicas, work)
        finally:
            stop(proc)
        rows.append((name, replicas, latency, record))
        print(f"{name}: probe {latency * 1000:.1f} ms, {record['output_throughput']:.1f} output tok/s", flush=True)
    single = rows[0][2]
    print("\n| set-up | replicas | output tok/s | per replica | TTFT p50 ms | one-token request ms | overhead ms |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, replicas, latency, record in rows:
        throughput = record["output_throughput"]
        print(
            f"| {name} | {replicas} | {throughput:.1f} | {throughput / replicas:.1f} | "
            f"{record['median_ttft_ms']:.0f} | {latency * 1000:.1f} | {(latency - single) * 1000:+.1f} |"
        )


if __name__ == "__main__":
    main()
