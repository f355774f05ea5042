"""ORT's profiler over a graph's runs: per-op time of a decode step and of a prefill (bench_graph.py
--profile), and the table that prints them."""

from __future__ import annotations

import json
import statistics
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np


def profile(make_graph, context: list[int], prefill: list[int], steps: int, batch: int = 1) -> dict:
    """Per-op time of a decode step (median over steps) and of one prefill, from ORT's profiler. With
    batch > 1 (ortserve graphs only) each decode step is that many sequences, one token each."""
    with tempfile.TemporaryDirectory() as tmp:
        graph = make_graph(str(Path(tmp) / "prof"))
        graph.reset()
        if batch == 1:
            graph.step(context)
            for i in range(steps + 2):
                graph.step([context[i % len(context)]])
        else:
            for seq in range(batch):
                graph.step(context, seq)
            for i in range(steps + 2):
                graph.step_batch([(seq, [context[(i + seq) % len(context)]]) for seq in range(batch)])
        graph.reset()
        graph.step(prefill)
        graph.reset()
        graph.step(prefill)
        path = graph.session.end_profiling()
        events = json.loads(Path(path).read_text())
    runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run = [defaultdict(float) for _ in runs]
    counts = [defaultdict(int) for _ in runs]
    starts = [r["ts"] for r in runs]
    for e in nodes:
        i = int(np.searchsorted(starts, e["ts"], side="right")) - 1
        role = _role(e["name"], e["args"].get("op_name", "?"))
        per_run[i][role] += e["dur"] / 1e3
        counts[i][role] += 1
    decode_runs = list(range(batch + 2, batch + 2 + steps))  # first the context prefills, then 2 warm decodes
    prefill_run = len(runs) - 1

    def summary(indices):
        roles = set().union(*(per_run[i] for i in indices))
        ops = {r: statistics.median(per_run[i].get(r, 0.0) for i in indices) for r in roles}
        wall = statistics.median(runs[i]["dur"] / 1e3 for i in indices)
        return {
            "wall_ms": wall,
            "kernels_ms": sum(ops.values()),
            "ops_ms": dict(sorted(ops.items(), key=lambda x: -x[1])),
            "nodes": dict(counts[indices[0]]),
        }

    return {"decode": summary(decode_runs), "prefill": summary([prefill_run])}


def _role(name: str, op: str) -> str:
    name = name.removesuffix("_kernel_time")
    if "lm_head" in name:
        return f"{op} (lm_head)"
    if "embed" in name:
        return f"{op} (embed)"
    return op


def print_profiles(profiles: dict[str, dict]) -> None:
    for phase in ("decode", "prefill"):
        print(f"\n### profile: {phase} ({'ms per step' if phase == 'decode' else 'ms per prompt'})")
        labels = list(profiles)
        roles = sorted(
            {r for p in profiles.values() for r in p[phase]["ops_ms"]},
            key=lambda r: -max(p[phase]["ops_ms"].get(r, 0) for p in profiles.values()),
        )
        print(f"{'op':<42}" + "".join(f"{l[:22]:>24}" for l in labels))
        for role in roles:
            cells = []
            for l in labels:
                p = profiles[l][phase]
                ms, n = p["ops_ms"].get(role), p["nodes"].get(role, 0)
                cells.append(f"{ms:9.3f} ms ×{n:<4d}" if ms is not None else "-")
            print(f"{role:<42}" + "".join(f"{c:>24}" for c in cells))
        for key, name in (("kernels_ms", "sum of kernels"), ("wall_ms", "run (wall)")):
            print(f"{name:<42}" + "".join(f"{profiles[l][phase][key]:>21.3f} ms" for l in labels))
        gap = [profiles[l][phase]["wall_ms"] - profiles[l][phase]["kernels_ms"] for l in labels]
        print(f"{'between kernels':<42}" + "".join(f"{g:>21.3f} ms" for g in gap))
        print(f"{'nodes run':<42}" + "".join(f"{sum(profiles[l][phase]['nodes'].values()):>24d}" for l in labels))
