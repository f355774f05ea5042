"""Prometheus metrics: vLLM's set under the ``ortserve:`` prefix, in a registry of this app's own.

After each step the engine reports its gauges, what its counters gained, and the latencies of
requests finished during the step (``StatsUpdate``). Engine deaths and stalls are counted here. Beyond
vLLM's set: the engine's steps and their time, in all and inside the model (``engine_steps``,
``engine_step_seconds``, ``model_run_seconds``).
"""

from __future__ import annotations

from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from ortserve.engine.ipc import StatsUpdate

__all__ = ["CONTENT_TYPE_LATEST", "ServerMetrics"]

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
)

# StatsUpdate counter field -> metric name (Prometheus adds _total).
COUNTERS = {
    "prefix_queries": ("prefix_cache_queries", "Prefix-cache queries, in tokens"),
    "prefix_hits": ("prefix_cache_hits", "Prefix-cache hits, in tokens"),
    "num_preemptions": ("num_preemptions", "Requests preempted (to be recomputed)"),
    "num_draft_tokens": ("spec_decode_num_draft_tokens", "Speculative draft tokens proposed"),
    "num_accepted_tokens": ("spec_decode_num_accepted_tokens", "Speculative draft tokens the model kept"),
    "prompt_tokens": ("prompt_tokens", "Prompt tokens processed (prefill)"),
    "generation_tokens": ("generation_tokens", "Tokens generated"),
    # where the engine's time goes: a step's mean is engine_step_seconds / engine_steps, and the share
    # of it outside the model (scheduling, sampling) 1 - model_run_seconds / engine_step_seconds
    "num_steps": ("engine_steps", "Engine steps run"),
    "step_seconds": (
        "engine_step_seconds",
        "Wall time inside engine steps (scheduling, the model, sampling; not detokenising)",
    ),
    "model_seconds": ("model_run_seconds", "Of engine_step_seconds, the time inside the model's onnxruntime run"),
}
# StatsUpdate latency list -> histogram.
HISTOGRAMS = {
    "ttft": ("time_to_first_token_seconds", "Time to first token", TTFT_BUCKETS),
    "tpot": ("time_per_output_token_seconds", "Time per output token after the first", TPOT_BUCKETS),
    "e2e": ("e2e_request_latency_seconds", "End-to-end request latency", E2E_BUCKETS),
}


class ServerMetrics:
    def __init__(self, model_name: str, prefix: str = "ortserve:") -> None:
        disable_created_metrics()  # no *_created samples (process-wide, as vLLM does)
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name"]

        def label(metric: Any) -> Any:
            return metric.labels(model_name=model_name)

        reg = self.registry
        self.running = label(
            Gauge(f"{prefix}num_requests_running", "Requests in the running batch", labels, registry=reg)
        )
        self.waiting = label(Gauge(f"{prefix}num_requests_waiting", "Requests waiting to run", labels, registry=reg))
        self.kv_usage = label(
            Gauge(f"{prefix}kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0 to 1)", labels, registry=reg)
        )
        self.counters = {
            field: label(Counter(f"{prefix}{name}", doc, labels, registry=reg))
            for field, (name, doc) in COUNTERS.items()
        }
        self.histograms = {
            field: label(Histogram(f"{prefix}{name}", doc, labels, buckets=buckets, registry=reg))
            for field, (name, doc, buckets) in HISTOGRAMS.items()
        }
        success = Counter(
            f"{prefix}request_success",
            "Finished requests by finish reason",
            ["model_name", "finished_reason"],
            registry=reg,
        )
        self.finished = {
            reason: success.labels(model_name=model_name, finished_reason=reason)
            for reason in ("stop", "length", "abort", "error")
        }
        events = Counter(
            f"{prefix}engine_events",
            "Engine deaths (restarted) and stalls (no progress for --engine-timeout seconds with requests pending)",
            ["model_name", "event"],
            registry=reg,
        )
        self.engine_events = {event: events.labels(model_name=model_name, event=event) for event in ("death", "stall")}

    def observe_stats(self, stats: StatsUpdate) -> None:
        self.running.set(stats.num_running)
        self.waiting.set(stats.num_waiting)
        self.kv_usage.set(stats.kv_usage)
        for field, counter in self.counters.items():
            if value := getattr(stats, field):  # most are 0 at most steps: skip their locks
                counter.inc(value)
        for value in stats.ttft:
            self.histograms["ttft"].observe(value)
        for value in stats.tpot:
            self.histograms["tpot"].observe(value)
        for value in stats.e2e:
            self.histograms["e2e"].observe(value)

    def observe_engine_event(self, event: str) -> None:
        self.engine_events[event].inc()

    def observe_finished(self, reason: str | None) -> None:
        metric = self.finished.get(reason or "abort")
        if metric is not None:
            metric.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
