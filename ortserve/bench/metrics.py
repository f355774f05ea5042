"""Serving metrics, defined as `vllm bench serve` defines them.

Per successful request, from client-side timestamps:
- TTFT  = time from sending the request to the first streamed chunk that carries a choice.
- ITL   = the gaps between consecutive such chunks (one value per chunk, not per token).
- E2EL  = time from sending the request to the last chunk that carries a choice.
- TPOT  = (E2EL - TTFT) / (output_tokens - 1), only for requests with more than one output token.
Over the run (duration = first request sent to last response done, wall clock):
request throughput = completed / duration, output throughput = output tokens / duration,
total token throughput = (input + output tokens) / duration.
Percentiles are numpy's (linear interpolation); every list is empty-safe (reports 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class RequestResult:
    """What one request measured. Times are seconds, `start_time` is time.perf_counter()."""

    success: bool = False
    prompt_len: int = 0
    output_tokens: int = 0  # from the server's usage, else counted with the tokenizer
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0  # E2EL
    start_time: float = 0.0
    generated_text: str = ""
    num_chunks: int = 0
    error: str = ""


@dataclass
class Distribution:
    mean_ms: float
    median_ms: float
    std_ms: float
    percentiles_ms: dict[str, float]  # "p99" -> value

    @classmethod
    def of(cls, seconds: list[float], percentiles: list[float]) -> Distribution:
        values = np.asarray(seconds if seconds else [0.0], dtype=np.float64) * 1000.0
        return cls(
            mean_ms=float(values.mean()),
            median_ms=float(np.median(values)),
            std_ms=float(values.std()),
            percentiles_ms={_pname(p): float(np.percentile(values, p)) for p in percentiles},
        )


def _pname(p: float) -> str:
    return f"p{p:g}"


@dataclass
class BenchmarkMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input: int
    total_output: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    ttft: Distribution
    tpot: Distribution
    itl: Distribution
    e2el: Distribution
    max_concurrent_requests: int


def tpot_of(output: RequestResult) -> float | None:
    """Time per output token after the first; None when there is no second token."""
    if output.output_tokens <= 1:
        return None
    return (output.latency - output.ttft) / (output.output_tokens - 1)


def peak_concurrency(outputs: list[RequestResult]) -> int:
    """Most requests in flight at once, over half-open intervals [start, start + latency)."""
    events = sorted([(o.start_time, 1) for o in outputs] + [(o.start_time + o.latency, -1) for o in outputs])
    current = peak = 0
    for _, delta in events:  # a departure (-1) sorts before an arrival (+1) at the same instant
        current += delta
        peak = max(peak, current)
    return peak


def calculate_metrics(
    outputs: list[RequestResult], duration_s: float, percentiles: list[float] = (99.0,)
) -> BenchmarkMetrics:
    ok = [o for o in outputs if o.success]
    ttfts = [o.ttft for o in ok]
    e2els = [o.latency for o in ok]
    itls = [gap for o in ok for gap in o.itl]
    tpots = [t for t in map(tpot_of, ok) if t is not None]
    total_input = sum(o.prompt_len for o in ok)
    total_output = sum(o.output_tokens for o in ok)
    percentiles = list(percentiles)
    return BenchmarkMetrics(
        completed=len(ok),
        failed=len(outputs) - len(ok),
        duration_s=duration_s,
        total_input=total_input,
        total_output=total_output,
        request_throughput=len(ok) / duration_s,
        output_throughput=total_output / duration_s,
        total_token_throughput=(total_input + total_output) / duration_s,
        ttft=Distribution.of(ttfts, percentiles),
        tpot=Distribution.of(tpots, percentiles),
        itl=Distribution.of(itls, percentiles),
        e2el=Distribution.of(e2els, percentiles),
        max_concurrent_requests=peak_concurrency(ok),
    )
