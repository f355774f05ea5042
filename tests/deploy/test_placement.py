"""Where serve-cluster's replicas run, on faked machines (this one has a single NUMA node): the
topology read from a /sys tree, the core slots cut from it, the cluster plan from the flags, and
the memory binding of the engine (checked with get_mempolicy in a child process)."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ortserve.deploy.cluster import ClusterError, plan_cluster
from ortserve.deploy.placement import (
    PlacementError,
    cores_per_replica_for,
    logical_cpus_per_core,
    plan_slots,
    slot_for,
    usable_nodes,
)
from ortserve.engine.threads import NumaNode, ThreadPlan, nodes_of, numa_nodes


def fake_sys(root: Path, nodes: dict[int, str], siblings: dict[int, str]) -> tuple[Path, Path]:
    """A /sys/devices/system tree: node<N>/cpulist and cpu<C>/topology/thread_siblings_list."""
    for node, cpulist in nodes.items():
        (root / "node" / f"node{node}").mkdir(parents=True)
        (root / "node" / f"node{node}" / "cpulist").write_text(cpulist + "\n")
    for cpu, sibling_list in siblings.items():
        (root / "cpu" / f"cpu{cpu}" / "topology").mkdir(parents=True)
        (root / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list").write_text(sibling_list + "\n")
    return root / "node", root / "cpu"


@pytest.fixture
def two_sockets(tmp_path: Path) -> list[NumaNode]:
    """2 NUMA nodes x 4 cores x 2 SMT threads: node 0 = CPUs 0-3 and their siblings 8-11,
    node 1 = CPUs 4-7 and 12-15 (Linux numbers the second threads after all first ones)."""
    siblings = {cpu: f"{cpu % 8},{cpu % 8 + 8}" for cpu in range(16)}
    sys_node, sys_cpu = fake_sys(tmp_path, {0: "0-3,8-11", 1: "4-7,12-15"}, siblings)
    return numa_nodes(sys_node, sys_cpu)


def test_topology_keeps_one_cpu_per_physical_core_per_node(two_sockets):
    assert two_sockets == [
        NumaNode(0, (0, 1, 2, 3, 8, 9, 10, 11), (0, 1, 2, 3)),
        NumaNode(1, (4, 5, 6, 7, 12, 13, 14, 15), (4, 5, 6, 7)),
    ]
    assert logical_cpus_per_core(two_sockets) == 2  # what a replica asks Ray for per core


def test_auto_places_one_replica_per_numa_node_on_that_nodes_cores(two_sockets):
    slots = plan_slots(two_sockets, None)
    assert [(s.cores, s.numa_node) for s in slots] == [((0, 1, 2, 3), 0), ((4, 5, 6, 7), 1)]
    assert slots[1].threads_bind == "4-7"  # the replica's --threads-bind
    assert slot_for(1, two_sockets, None).numa_node == 1
    with pytest.raises(PlacementError, match="replica 2 on this machine has no core slot: it has 2 slots"):
        slot_for(2, two_sockets, None)


def test_fixed_size_slots_never_span_two_nodes(two_sockets):
    assert [s.cores for s in plan_slots(two_sockets, 2)] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert [s.cores for s in plan_slots(two_sockets, 3)] == [(0, 1, 2), (4, 5, 6)]  # cores 3 and 7 unused
    assert plan_slots(two_sockets, 5) == []
    with pytest.raises(PlacementError, match="--cores-per-replica"):
        slot_for(0, two_sockets, 5)


def test_cores_per_replica_defaults_to_the_most_that_fit(two_sockets):
    assert cores_per_replica_for(two_sockets, 1) == 4  # one node's worth: a slot never spans nodes
    assert cores_per_replica_for(two_sockets, 2) == 4
    assert cores_per_replica_for(two_sockets, 3) == 2
    assert cores_per_replica_for(two_sockets, 8) == 1
    with pytest.raises(PlacementError, match="--replicas 9 needs at least 9 physical cores"):
        cores_per_replica_for(two_sockets, 9)


def test_a_cpuset_limits_the_slots(two_sockets):
    nodes = usable_nodes(two_sockets, allowed={0, 1, 4, 12})
    assert [(n.node, n.cores) for n in nodes] == [(0, (0, 1)), (1, (4,))]
    assert usable_nodes(two_sockets, allowed={5}) == [NumaNode(1, (5,), (5,))]


def cluster_args(**flags) -> argparse.Namespace:
    defaults = dict(
        replicas="auto", cores_per_replica=None, min_replicas=None, max_replicas=None, target_ongoing_requests=16.0
    )
    defaults["address"] = None
    return argparse.Namespace(**{**defaults, **flags})


def test_cluster_plan_from_the_flags(two_sockets):
    auto = plan_cluster(cluster_args(), two_sockets)
    assert (auto.replicas, auto.cores_per_replica, auto.cpus_per_replica) == (2, None, 8)
    three = plan_cluster(cluster_args(replicas="3"), two_sockets)
    assert (three.replicas, three.cores_per_replica, three.cpus_per_replica) == (3, 2, 4)
    scaled = plan_cluster(cluster_args(replicas="2", cores_per_replica=2, min_replicas=1, max_replicas=4), two_sockets)
    assert scaled.autoscaling == {
        "min_replicas": 1,
        "max_replicas": 4,
        "initial_replicas": 2,
        "target_ongoing_requests": 16.0,
    }
    with pytest.raises(ClusterError, match="5 replicas of 2 cores do not fit this machine's 4 slots"):
        plan_cluster(cluster_args(replicas="2", cores_per_replica=2, max_replicas=5), two_sockets)
    with pytest.raises(ClusterError, match="--min-replicas 3 <= --replicas 2"):
        plan_cluster(cluster_args(replicas="2", min_replicas=3), two_sockets)
    with pytest.raises(ClusterError, match="--replicas 'many'"):
        plan_cluster(cluster_args(replicas="many"), two_sockets)
    # On a Ray cluster the replicas spread over machines: this one's slots do not bound them.
    assert plan_cluster(cluster_args(replicas="6", address="ray://head:10001"), two_sockets).cores_per_replica == 4


def test_memory_follows_the_cores_numa_node(two_sockets):
    assert nodes_of((4, 5), two_sockets) == [1]
    assert nodes_of((3, 12), two_sockets) == [0, 1]


def test_the_engine_binds_its_memory_with_set_mempolicy():
    """bind_memory in a fresh process, on a faked two-node machine whose node 0 is this machine's
    real node: get_mempolicy must then read MPOL_BIND with node 0 alone."""
    real = numa_nodes()[0]
    script = textwrap.dedent(f"""
        import ctypes
        from ortserve.engine.threads import NumaNode, ThreadPlan, bind_memory
        nodes = [NumaNode(0, {real.cpus!r}, {real.cores!r}), NumaNode(1, (9999,), (9999,))]
        assert bind_memory(ThreadPlan(cores=({real.cores[0]},), bind=True), nodes) == [0]
        mode, mask = ctypes.c_int(-1), ctypes.c_ulong(0)
        libc = ctypes.CDLL(None, use_errno=True)
        number = {{"x86_64": 239, "aarch64": 236}}[__import__("os").uname().machine]  # get_mempolicy
        flags = ctypes.c_ulong(0)
        assert libc.syscall(number, ctypes.byref(mode), ctypes.byref(mask), ctypes.c_ulong(65), None, flags) == 0
        print(mode.value, mask.value)
        """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "1"]  # MPOL_BIND, node 0


def test_nothing_is_bound_on_one_node_or_without_pinning(two_sockets):
    from ortserve.engine.threads import bind_memory

    assert bind_memory(ThreadPlan(cores=(0,), bind=True), two_sockets[:1]) == []
    assert bind_memory(ThreadPlan(cores=(0,), bind=False), two_sockets) == []
