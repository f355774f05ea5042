"""The result table (laid out like `vllm bench serve`'s) and the JSON record (same key names)."""

from __future__ import annotations

import json
from pathlib import Path

from ortserve.bench.metrics import BenchmarkMetrics, RequestResult

_SECTIONS = (
    ("ttft", "Time to First Token", "TTFT"),
    ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
    ("itl", "Inter-token Latency", "ITL"),
    ("e2el", "End-to-end Latency", "E2EL"),
)


def format_table(
    m: BenchmarkMetrics, max_concurrency: int | None, request_rate: float, server_delta: dict[str, float]
) -> str:
    rows = [f"{' Serving Benchmark Result ':=^50}"]
    row = lambda label, value: rows.append(f"{label:<40} {value:<10}")
    row("Successful requests:", m.completed)
    row("Failed requests:", m.failed)
    if max_concurrency:
        row("Maximum request concurrency:", max_concurrency)
    if request_rate != float("inf"):
        row("Request rate configured (RPS):", f"{request_rate:.2f}")
    row("Benchmark duration (s):", f"{m.duration_s:.2f}")
    row("Total input tokens:", m.total_input)
    row("Total generated tokens:", m.total_output)
    row("Request throughput (req/s):", f"{m.request_throughput:.2f}")
    row("Output token throughput (tok/s):", f"{m.output_throughput:.2f}")
    row("Total token throughput (tok/s):", f"{m.total_token_throughput:.2f}")
    row("Peak concurrent requests:", m.max_concurrent_requests)
    for key, title, short in _SECTIONS:
        d = getattr(m, key)
        rows.append(f"{title:-^50}")
        row(f"Mean {short} (ms):", f"{d.mean_ms:.2f}")
        row(f"Median {short} (ms):", f"{d.median_ms:.2f}")
        for name, value in d.percentiles_ms.items():
            row(f"{name.upper()} {short} (ms):", f"{value:.2f}")
    if server_delta:
        rows.append(f"{'Server counters (delta over run)':-^50}")
        for name, value in server_delta.items():
            row(f"{name}:", f"{value:g}")
    rows.append("=" * 50)
    return "\n".join(rows)


def result_record(
    m: BenchmarkMetrics, outputs: list[RequestResult], config: dict, server_delta: dict[str, float]
) -> dict:
    record = dict(config)
    record.update(
        duration=m.duration_s,
        completed=m.completed,
        failed=m.failed,
        total_input_tokens=m.total_input,
        total_output_tokens=m.total_output,
        request_throughput=m.request_throughput,
        output_throughput=m.output_throughput,
        total_token_throughput=m.total_token_throughput,
        max_concurrent_requests=m.max_concurrent_requests,
    )
    for key, _, _ in _SECTIONS:
        d = getattr(m, key)
        record[f"mean_{key}_ms"] = d.mean_ms
        record[f"median_{key}_ms"] = d.median_ms
        record[f"std_{key}_ms"] = d.std_ms
        for name, value in d.percentiles_ms.items():
            record[f"{name}_{key}_ms"] = value
    record.update(
        input_lens=[o.prompt_len for o in outputs],
        output_lens=[o.output_tokens for o in outputs],
        ttfts=[o.ttft for o in outputs],
        itls=[o.itl for o in outputs],
        errors=[o.error for o in outputs],
        server_counters_delta=server_delta,
    )
    return record


def write_json(path: str | Path, record: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1))
