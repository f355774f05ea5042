"""Where each engine replica of ``ortserve serve-cluster`` runs on its machine: a core slot.

A machine's physical cores (one logical CPU per core, read from /sys by ``engine.threads``) are cut
into slots that never span a NUMA node:

- ``--replicas auto``: one slot per NUMA node holding all of its cores, so each replica's threads
  and memory stay on one node (vLLM's CPU backend runs one rank per NUMA node the same way);
- ``--cores-per-replica C``: consecutive groups of C cores inside each node; a node's leftover
  cores stay unused.

Ray Serve numbers the replicas on each machine (``ReplicaRank.local_rank``, the smallest free
number first, reused when a replica is replaced), and replica k takes slot k. Ray's CPU resource
(``cpus_per_replica``) keeps Ray from putting more replicas on a machine than it has slots.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from ortserve.engine.threads import NumaNode, format_cpu_list, numa_nodes


class PlacementError(ValueError):
    """The replicas cannot be placed as asked; the message names the flag and what would fit."""


@dataclass(frozen=True)
class Slot:
    cores: tuple[int, ...]
    numa_node: int

    @property
    def threads_bind(self) -> str:
        """The replica's ``--threads-bind`` value."""
        return format_cpu_list(self.cores)


def usable_nodes(nodes: list[NumaNode] | None = None, allowed: set[int] | None = None) -> list[NumaNode]:
    """This machine's NUMA nodes, limited to the CPUs this process may use (a container's
    cpuset), without the nodes left empty (memory-only nodes)."""
    nodes = numa_nodes() if nodes is None else nodes
    allowed = os.sched_getaffinity(0) if allowed is None else allowed
    kept = [
        NumaNode(n.node, tuple(c for c in n.cpus if c in allowed), tuple(c for c in n.cores if c in allowed))
        for n in nodes
    ]
    return [n for n in kept if n.cores]


def plan_slots(nodes: list[NumaNode], cores_per_replica: int | None) -> list[Slot]:
    """The machine's slots, node by node: all of a node's cores (``None``, the auto placement), or
    groups of ``cores_per_replica`` cores."""
    slots = []
    for node in nodes:
        if cores_per_replica is None:
            if node.cores:
                slots.append(Slot(node.cores, node.node))
            continue
        for start in range(0, len(node.cores) - cores_per_replica + 1, cores_per_replica):
            slots.append(Slot(node.cores[start : start + cores_per_replica], node.node))
    return slots


def slot_for(local_rank: int, nodes: list[NumaNode], cores_per_replica: int | None) -> Slot:
    """The slot of the replica numbered ``local_rank`` on this machine."""
    slots = plan_slots(nodes, cores_per_replica)
    if local_rank < len(slots):
        return slots[local_rank]
    layout = ", ".join(f"node {n.node}: {len(n.cores)} cores" for n in nodes)
    what = "one per NUMA node" if cores_per_replica is None else f"{cores_per_replica} cores each"
    raise PlacementError(
        f"replica {local_rank} on this machine has no core slot: it has {len(slots)} slots of {what} "
        f"({layout}); use fewer replicas per machine or a smaller --cores-per-replica"
    )


def cores_per_replica_for(nodes: list[NumaNode], replicas: int) -> int:
    """The most cores each of ``replicas`` replicas can get on this machine without a slot
    spanning two NUMA nodes (``--replicas N`` without ``--cores-per-replica``)."""
    for cores in range(max(len(n.cores) for n in nodes), 0, -1):
        if len(plan_slots(nodes, cores)) >= replicas:
            return cores
    total = sum(len(n.cores) for n in nodes)
    raise PlacementError(
        f"--replicas {replicas} needs at least {replicas} physical cores on this machine, which has {total}; "
        f"use --replicas {total} or fewer, or --address to spread them over a Ray cluster"
    )


def logical_cpus_per_core(nodes: list[NumaNode]) -> int:
    """Logical CPUs per physical core (2 with SMT): a replica asks Ray for its cores times this,
    because Ray counts logical CPUs."""
    cores = sum(len(n.cores) for n in nodes)
    cpus = sum(len(n.cpus) for n in nodes)
    return max(1, cpus // max(1, cores))
