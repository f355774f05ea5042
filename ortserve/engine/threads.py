"""Which cores the engine runs on: parse --threads-bind / --reserved-cpus into a thread plan.

The plan gives ONNX Runtime ``intra_op_num_threads = len(cores)``; the engine's calling thread
(which ORT uses as thread 0 of the pool) is pinned to ``cores[0]`` with ``os.sched_setaffinity``
and the pool's other threads to ``cores[1:]`` through the session config key
``session.intra_op_thread_affinities`` (1-based logical processor ids, one entry per thread).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


class ThreadsBindError(ValueError):
    """--threads-bind / --reserved-cpus name cores the process cannot use."""


@dataclass(frozen=True)
class ThreadPlan:
    cores: tuple[int, ...]  # one intra-op thread per core, the calling thread on cores[0]
    bind: bool  # False for "nobind": ORT threads float, nothing is pinned

    @property
    def num_threads(self) -> int:
        return len(self.cores)

    def ort_affinities(self) -> str:
        """``session.intra_op_thread_affinities`` for the pool threads 1..n-1 (ORT counts
        logical processors from 1)."""
        return ";".join(str(core + 1) for core in self.cores[1:])

    def describe(self) -> str:
        if not self.bind:
            return f"{self.num_threads} intra-op threads, not pinned (--threads-bind nobind)"
        return (
            f"{self.num_threads} intra-op threads pinned to cores {format_cpu_list(self.cores)} "
            f"(engine thread on core {self.cores[0]})"
        )


def parse_cpu_list(text: str) -> list[int]:
    """'0-3,6,8-9' -> [0, 1, 2, 3, 6, 8, 9] (sorted, unique)."""
    cores: set[int] = set()
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        if not first.isdigit() or (last and not last.isdigit()):
            raise ThreadsBindError(f"--threads-bind {text!r}: {part!r} is not a core number or range like 0-3")
        low, high = int(first), int(last or first)
        if high < low:
            raise ThreadsBindError(f"--threads-bind {text!r}: range {part!r} runs backwards")
        cores.update(range(low, high + 1))
    if not cores:
        raise ThreadsBindError(f"--threads-bind {text!r} names no cores; use a list like 0-3, 'auto' or 'nobind'")
    return sorted(cores)


def format_cpu_list(cores: Iterable[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    cores = sorted(cores)
    parts, start = [], None
    for i, core in enumerate(cores):
        if start is None:
            start = core
        if i + 1 == len(cores) or cores[i + 1] != core + 1:
            parts.append(str(start) if start == core else f"{start}-{core}")
            start = None
    return ",".join(parts)


def _read_cpu_list(path: Path) -> list[int] | None:
    try:
        return parse_cpu_list(path.read_text().strip())
    except (OSError, ThreadsBindError):
        return None


def physical_cores(allowed: list[int]) -> list[int]:
    """The first logical CPU of each physical core in ``allowed``, on the NUMA node of the first
    allowed CPU (one engine serves one node, docs/design.md §7)."""
    node_cpus = None
    for node in sorted(SYS_NODE.glob("node[0-9]*")):
        cpus = _read_cpu_list(node / "cpulist")
        if cpus and allowed[0] in cpus:
            node_cpus = set(cpus)
            break
    chosen: list[int] = []
    seen: set[int] = set()
    for cpu in allowed:
        if node_cpus is not None and cpu not in node_cpus:
            continue
        siblings = _read_cpu_list(SYS_CPU / f"cpu{cpu}" / "topology" / "thread_siblings_list") or [cpu]
        if seen.isdisjoint(siblings):
            chosen.append(cpu)
        seen.update(siblings)
    return chosen


def plan_threads(threads_bind: str = "auto", reserved_cpus: int = 0) -> ThreadPlan:
    allowed = sorted(os.sched_getaffinity(0))
    mode = threads_bind.strip().lower()
    if mode == "nobind":
        count = len(allowed) - reserved_cpus
        if count < 1:
            raise ThreadsBindError(f"--reserved-cpus {reserved_cpus} leaves no core of the {len(allowed)} available")
        return ThreadPlan(cores=tuple(allowed[:count]), bind=False)
    if mode == "auto":
        cores = physical_cores(allowed)
        if reserved_cpus >= len(cores):
            raise ThreadsBindError(
                f"--reserved-cpus {reserved_cpus} leaves no core for the engine: --threads-bind auto "
                f"found {len(cores)} physical cores ({format_cpu_list(cores)}); use at most {len(cores) - 1}"
            )
        return ThreadPlan(cores=tuple(cores[: len(cores) - reserved_cpus]), bind=True)
    cores = parse_cpu_list(mode)
    missing = sorted(set(cores) - set(allowed))
    if missing:
        raise ThreadsBindError(
            f"--threads-bind {threads_bind!r} names cores {format_cpu_list(missing)} that this process may not "
            f"use; available: {format_cpu_list(allowed)}"
        )
    return ThreadPlan(cores=tuple(cores), bind=True)


def pin_calling_thread(plan: ThreadPlan) -> None:
    """Pin the thread that calls ``session.run`` (ORT's thread 0) to the plan's first core."""
    if plan.bind:
        os.sched_setaffinity(0, {plan.cores[0]})
