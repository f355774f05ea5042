"""`ortserve bench serve` against a live `ortserve serve` (SmolLM2-135M, fp32) on 127.0.0.1:
its request and token counts must agree with the server's own /metrics counters."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from ortserve.cli import main as ortserve_main

pytestmark = pytest.mark.slow  # the real SmolLM2 weights

LISTENING = re.compile(r"listening on (http://[\d.]+:\d+)")


@pytest.fixture(scope="module")
def server(smollm2_artifact: Path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ortserve.cli",
            "serve",
            str(smollm2_artifact),
            "--port",
            "0",
            "--served-model-name",
            "smol",
            "--kv-cache-space",
            "0.25",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + 300
        while not (url := next((m.group(1) for m in map(LISTENING.search, list(lines)) if m), None)):
            assert proc.poll() is None and time.monotonic() < deadline, "server did not listen:\n" + "".join(lines)
            time.sleep(0.2)
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "server died:\n" + "".join(lines)
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def bench(url: str, tokenizer: Path, out: Path, *flags: str) -> dict:
    code = ortserve_main(
        [
            "bench",
            "serve",
            "--base-url",
            url,
            "--tokenizer",
            str(tokenizer),
            "--num-prompts",
            "6",
            "--max-concurrency",
            "3",
            "--input-len",
            "64",
            "--output-len",
            "16",
            "--disable-tqdm",
            "--result-json",
            str(out),
            *flags,
        ]
    )
    assert code == 0
    return json.loads(out.read_text())


def test_bench_counts_agree_with_the_server_counters(server, smollm2_checkpoint, tmp_path):
    record = bench(server, smollm2_checkpoint, tmp_path / "random.json")
    server_side = record["server_counters_delta"]
    assert record["completed"] == 6 and record["failed"] == 0
    assert record["output_lens"] == [16] * 6  # ignore_eos + max_tokens: fixed lengths
    assert server_side["ortserve:request_success_total"] == record["completed"]
    assert server_side["ortserve:prompt_tokens_total"] == record["total_input_tokens"]
    assert server_side["ortserve:generation_tokens_total"] == record["total_output_tokens"] == 6 * 16
    assert record["model"] == "smol"  # found through /v1/models
    assert record["median_tpot_ms"] > 0 and record["p99_itl_ms"] > 0


def test_shared_prefix_workload_hits_the_prefix_cache(server, smollm2_checkpoint, tmp_path):
    record = bench(
        server,
        smollm2_checkpoint,
        tmp_path / "shared.json",
        "--dataset",
        "shared-prefix",
        "--prefix-len",
        "48",
        "--request-rate",
        "20",
    )
    server_side = record["server_counters_delta"]
    assert record["completed"] == 6 and record["input_lens"] == [64] * 6
    assert server_side["ortserve:prompt_tokens_total"] == 6 * 64
    assert server_side.get("ortserve:prefix_cache_hits_total", 0) >= 5 * 48  # 3 full blocks of 16, after the first
