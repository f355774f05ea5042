"""The reliability suite: faults injected into a live server, bursts, hostile requests, load with
cancellations, a soak, and schemathesis. CI runs the short form; ``--reliability-long`` runs the
long one and writes tests/reliability/REPORT.md from what every test recorded."""

from __future__ import annotations

import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "server"))  # server_process, fake_engine

REPORT = Path(__file__).parent / "REPORT.md"


class Tally:
    """What the suite did, for the report: requests by outcome, faults, recoveries, leaks, latencies."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self.recoveries = 0
        self.leaked_blocks: list[float] = []
        self.server_exits = 0
        self.tracebacks = 0
        self.latencies: list[float] = []
        self.rows: list[tuple[str, str]] = []

    def response(self, outcome: str, latency: float | None = None, text: str = "") -> None:
        self.outcomes[outcome] += 1
        if latency is not None:
            self.latencies.append(latency)
        if "Traceback" in text or 'File "' in text:
            self.tracebacks += 1


@pytest.fixture(scope="session")
def long_run(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--reliability-long"))


@pytest.fixture(scope="session")
def tally(long_run: bool):
    record = Tally()
    started = time.time()
    yield record
    if long_run:
        write_report(record, time.time() - started)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def write_report(t: Tally, seconds: float) -> None:
    sent = sum(t.outcomes.values())
    lines = [
        "# Reliability report",
        "",
        f"`pytest tests/reliability --reliability-long` ({seconds / 60:.1f} min), written by the run itself.",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| requests sent | {sent} |",
        f"| completed | {t.outcomes['completed']} |",
        *[f"| failed: {cause} | {n} |" for cause, n in sorted(t.outcomes.items()) if cause != "completed"],
        *[f"| faults injected: {kind} | {n} |" for kind, n in sorted(t.faults.items())],
        f"| recoveries | {t.recoveries} |",
        f"| KV blocks leaked (usage after each phase) | {max(t.leaked_blocks, default=0.0):g} |",
        f"| server exits | {t.server_exits} |",
        f"| responses with a traceback | {t.tracebacks} |",
        f"| latency p50 under load (s) | {percentile(t.latencies, 0.5):.3f} |",
        f"| latency p99 under load (s) | {percentile(t.latencies, 0.99):.3f} |",
        "",
        *[f"- {name}: {value}" for name, value in t.rows],
        "",
    ]
    REPORT.write_text("\n".join(lines))
