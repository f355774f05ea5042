"""How much CPU other tenants took while a part ran: all busy CPU time on the machine (/proc/stat)
minus what this process tree used (itself, its reaped children, its live descendants).
On a shared host this says which rows a neighbour slowed down."""

from __future__ import annotations

import os
import time

_TICK = os.sysconf("SC_CLK_TCK")


def _busy_seconds() -> float:
    fields = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / _TICK  # user..steal, no guest (already in user)


def _tree_seconds() -> float:
    t = os.times()
    total = t.user + t.system + t.children_user + t.children_system
    me = os.getpid()
    parents, cpu = {}, {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        rest = stat.rsplit(")", 1)[1].split()
        parents[int(pid)] = int(rest[1])
        cpu[int(pid)] = (int(rest[11]) + int(rest[12])) / _TICK  # utime + stime
    for pid in cpu:
        p = parents.get(pid)
        while p and p != me:
            p = parents.get(p)
        if p == me:
            total += cpu[pid]
    return total


class Meter:
    def __init__(self):
        self.mark()

    def mark(self) -> None:
        self._wall, self._busy, self._tree = time.monotonic(), _busy_seconds(), _tree_seconds()

    def share(self) -> float:
        """Fraction of all cores' time, since mark(), that went to processes outside this tree."""
        wall = time.monotonic() - self._wall
        other = (_busy_seconds() - self._busy) - (_tree_seconds() - self._tree)
        return max(0.0, other) / (wall * os.cpu_count()) if wall > 0 else 0.0
