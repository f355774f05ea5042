"""Deployment fixtures: ``ortserve serve-cluster`` on a local Ray cluster of 2 CPUs, started as a
real process and stopped with SIGTERM; after it stops, no process it started may be left (Ray's
daemons and workers, the replicas' servers and engines are found by the RAY_TMPDIR each inherits).

CI runs the short form of the Ray tests; ``pytest tests/deploy --ray-long`` runs the long one."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "server"))  # server_process

from cluster_process import REPLICA_FLAGS, Cluster, free_port, our_processes, stop_cluster
from server_process import ServerProcess


@pytest.fixture(scope="session")
def ray_long(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--ray-long"))


@pytest.fixture(scope="module")
def start_cluster(tiny_llama_artifact: Path) -> Iterator:
    """Start ``serve-cluster`` on the tiny artifact: 2 replicas of 1 core each; returns a Cluster.
    Whatever is still running at the end of the module is stopped and checked."""
    started: list[Cluster] = []

    def start(router: str = "prefix", *flags: str) -> Cluster:
        ray_tmp = Path(tempfile.mkdtemp(prefix="osr", dir="/tmp"))  # short: Ray's socket paths have a limit
        port = free_port()
        argv = [sys.executable, "-m", "ortserve.cli", "serve-cluster", str(tiny_llama_artifact)]
        argv += ["--replicas", "2", "--cores-per-replica", "1", "--num-cpus", "2", "--port", str(port)]
        process = ServerProcess([*argv, "--router", router, *REPLICA_FLAGS, *flags], env={"RAY_TMPDIR": str(ray_tmp)})
        cluster = Cluster(process, f"http://127.0.0.1:{port}", ray_tmp)
        started.append(cluster)
        process.wait_ready(300)
        cluster.wait_replicas(2)
        return cluster

    yield start
    for cluster in started:
        if cluster.process.proc.poll() is None or our_processes(cluster.ray_tmp):
            stop_cluster(cluster)
        shutil.rmtree(cluster.ray_tmp, ignore_errors=True)
