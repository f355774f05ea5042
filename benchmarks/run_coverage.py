"""Which compare.py runs measured the records behind RESULTS.md (run.json holds each run's command
and span, each record its time), and what the full comparison still misses."""

from __future__ import annotations

from datetime import datetime

from runners.common import MODELS


def coverage(records: list[dict], runs: list[dict]) -> str:
    """How much of the full comparison the records cover, whether one run measured them all, and
    what is missing."""
    from runners import RUNNERS

    have = {(r["model"], r["system"], r["precision"], r["workload"]) for r in records}
    want = {
        (m, name, q, w)
        for m in MODELS
        for name, runner in RUNNERS.items()
        for q in runner.PRECISIONS
        for w in runner.WORKLOADS_SUPPORTED
    }
    missing = sorted(want - have)
    by_part: dict[tuple, list[str]] = {}
    for m, name, q, w in missing:
        by_part.setdefault((m, name, q), []).append(w)
    text = f"Coverage: {len(want & have)} of {len(want)} parts measured."
    run = one_run(records, runs)
    if missing and run:
        text = (
            f"**One run, part of the comparison.** Every row below is from {run_label(run)}: "
            "its ratios compare like with like. " + text
        )
    elif missing and (parts := runs_behind(records, runs)):
        listed = "; ".join(f"{run_label(r)}: {n} rows" for r, n in parts)
        text = (
            f"**{len(parts)} runs, part of the comparison.** A later run replaced the rows it re-measured: {listed}. "
            "A target whose two systems come from different runs says so. " + text
        )
    elif missing:
        text = (
            "**Partial run.** Rows below were measured at different times under different neighbour load, so the"
            " ratios are indicative only; `python benchmarks/compare.py --repeat 3` on a quiet machine gives the"
            " real comparison. " + text
        )
        text += (
            " Missing: "
            + "; ".join(f"{m} {name} {q} ({', '.join(ws)})" for (m, name, q), ws in sorted(by_part.items()))
            + "."
        )
    return text


def run_label(run: dict) -> str:
    """A run's command and span, and where it was stopped if it did not finish (``--repeat 3``
    stopped in round 3 keeps the best of 2)."""
    stopped = f", {run['stopped']}" if run.get("stopped") else ""
    return f"`{run['command']}` ({run['started']} to {run['finished']}{stopped})"


def one_run(records: list[dict], runs: list[dict]) -> dict | None:
    """The run that measured every record, if one did (records carry their time, runs their span)."""
    times = [datetime.fromisoformat(r["when"]) for r in records if r.get("when")]
    for run in runs:
        try:
            start, end = datetime.fromisoformat(run["started"]), datetime.fromisoformat(run["finished"])
        except ValueError:
            continue
        if times and all(start <= t <= end for t in times):
            return run
    return None


def run_of(record: dict, runs: list[dict]) -> int | None:
    """The index in ``runs`` of the latest run whose span holds the record's time."""
    if not record.get("when"):
        return None
    t = datetime.fromisoformat(record["when"])
    found = None
    for i, run in enumerate(runs):
        try:
            if datetime.fromisoformat(run["started"]) <= t <= datetime.fromisoformat(run["finished"]):
                found = i
        except ValueError:
            continue
    return found


def runs_behind(records: list[dict], runs: list[dict]) -> list[tuple[dict, int]]:
    """(run, rows) for the runs that measured the records, oldest first; empty if a record has none."""
    indices = [run_of(r, runs) for r in records]
    if not indices or None in indices:
        return []
    return [(runs[i], indices.count(i)) for i in sorted(set(indices))]  # type: ignore[arg-type]
