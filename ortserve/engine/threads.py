"""Which cores the engine runs on: parse --threads-bind / --reserved-cpus into a thread plan.

The plan gives ONNX Runtime ``intra_op_num_threads = len(cores)``; the engine's calling thread
(which ORT uses as thread 0 of the pool) is pinned to ``cores[0]`` with ``os.sched_setaffinity``
and the pool's other threads to ``cores[1:]`` through the session config key
``session.intra_op_thread_affinities`` (1-based logical processor ids, one entry per thread).

Memory follows the cores: on a machine with several NUMA nodes, ``bind_memory`` binds the engine's
allocations (weights, KV cache, ORT's pool threads created afterwards) to the nodes of the plan's
cores with ``set_mempolicy(MPOL_BIND)``, as vLLM's CPU backend does with ``numa_set_membind``.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")
MPOL_BIND = 2  # <linux/mempolicy.h>
SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}  # syscall numbers

logger = logging.getLogger("ortserve.engine")


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


def cores_left(engine_cores: Iterable[int]) -> list[int]:
    """The cores this process may run on that the engine's pinned threads do not: the HTTP server's
    (--reserved-cpus); [] = none left, so it streams on the engine's cores."""
    return sorted(set(os.sched_getaffinity(0)) - set(engine_cores))


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


@dataclass(frozen=True)
class NumaNode:
    node: int
    cpus: tuple[int, ...]  # every logical CPU of the node
    cores: tuple[int, ...]  # the first logical CPU of each physical core, ascending


def numa_nodes(sys_node: Path = SYS_NODE, sys_cpu: Path = SYS_CPU) -> list[NumaNode]:
    """The machine's NUMA nodes and their physical cores (one logical CPU per core: SMT siblings
    share a core's units, so a second thread on them adds little). A machine without
    ``/sys/devices/system/node`` reads as one node holding every CPU this process may use."""
    found: list[tuple[int, list[int]]] = []
    for folder in sorted(sys_node.glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        cpus = _read_cpu_list(folder / "cpulist")
        if cpus:
            found.append((int(folder.name[4:]), cpus))
    if not found:
        found = [(0, sorted(os.sched_getaffinity(0)))]
    return [NumaNode(node, tuple(cpus), tuple(_first_of_each_core(cpus, sys_cpu))) for node, cpus in found]


def _first_of_each_core(cpus: Iterable[int], sys_cpu: Path = SYS_CPU) -> list[int]:
    chosen: list[int] = []
    seen: set[int] = set()
    for cpu in cpus:
        siblings = _read_cpu_list(sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list") or [cpu]
        if seen.isdisjoint(siblings):
            chosen.append(cpu)
        seen.update(siblings)
    return chosen


def physical_cores(allowed: list[int]) -> list[int]:
    """The first logical CPU of each physical core in ``allowed``, on the NUMA node of the first
    allowed CPU (one engine serves one node, docs/design.md §6)."""
    node = next((n for n in numa_nodes() if allowed[0] in n.cpus), None)
    return _first_of_each_core(c for c in allowed if node is None or c in node.cpus)


def plan_threads(threads_bind: str = "auto", reserved_cpus: int = 0, threads: int | None = None) -> ThreadPlan:
    """``threads`` (--threads, llama.cpp's -t): how many cores the engine uses, the first of those
    --threads-bind auto or nobind would use; a core list says it by itself."""
    plan = _plan_cores(threads_bind, reserved_cpus)
    if threads is None:
        return plan
    if threads_bind.strip().lower() not in ("auto", "nobind"):
        raise ThreadsBindError(f"--threads {threads} and --threads-bind {threads_bind!r}: give one (a list sets both)")
    if threads > len(plan.cores):
        raise ThreadsBindError(
            f"--threads {threads}: the engine has {len(plan.cores)} cores to run on "
            f"({format_cpu_list(plan.cores)}, --threads-bind {threads_bind}); use at most {len(plan.cores)}"
        )
    return ThreadPlan(cores=plan.cores[:threads], bind=plan.bind)


def _plan_cores(threads_bind: str, reserved_cpus: int) -> ThreadPlan:
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


def nodes_of(cores: Iterable[int], nodes: list[NumaNode]) -> list[int]:
    """The NUMA nodes that hold any of ``cores``."""
    wanted = set(cores)
    return [n.node for n in nodes if wanted.intersection(n.cpus)]


def bind_memory(plan: ThreadPlan, nodes: list[NumaNode] | None = None) -> list[int]:
    """Bind the calling thread's future allocations (and those of threads it creates) to the NUMA
    nodes of the plan's cores; returns them ([] when nothing was bound: one node, or nobind).
    A kernel or container that forbids set_mempolicy leaves memory unbound, with a warning."""
    nodes = numa_nodes() if nodes is None else nodes
    if not plan.bind or len(nodes) < 2:
        return []
    chosen = nodes_of(plan.cores, nodes)
    number = SYS_SET_MEMPOLICY.get(os.uname().machine)
    if not chosen or number is None:
        return []
    mask = ctypes.c_ulong(sum(1 << n for n in chosen))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(number, MPOL_BIND, ctypes.byref(mask), ctypes.c_ulong(ctypes.sizeof(mask) * 8 + 1)) != 0:
        logger.warning(
            "could not bind memory to NUMA nodes %s (set_mempolicy: %s); allocations may cross nodes",
            chosen,
            os.strerror(ctypes.get_errno()),
        )
        return []
    return chosen
