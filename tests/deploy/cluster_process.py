"""A serve-cluster process for the tests, and the check that it leaves nothing running."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from server_process import ServerProcess

SERVED_NAME = "tiny"
# Two sequences per engine step: a replica busy with two long streams keeps what comes next waiting
# in its engine, not started, which is what the kill test needs.
REPLICA_FLAGS = (
    "--served-model-name",
    SERVED_NAME,
    "--kv-cache-space",
    "0.05",
    "--public-metrics",
    "--max-num-seqs",
    "2",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Cluster:
    process: ServerProcess
    url: str
    ray_tmp: Path

    def replicas(self) -> list[dict]:
        return httpx.get(f"{self.url}/cluster", timeout=10).json()["replicas"]

    def wait_replicas(self, count: int, timeout: float = 180, exclude: set[str] = frozenset()) -> list[dict]:
        """The replicas once ``count`` of them report in, none of them in ``exclude``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            replicas = [r for r in self.replicas() if r["replica_id"] not in exclude]
            if len(replicas) >= count:
                return replicas
            time.sleep(0.5)
        raise AssertionError(f"{count} replicas did not report in within {timeout} s:\n{self.process.output[-5000:]}")


def our_processes(ray_tmp: Path) -> list[int]:
    """Processes that inherited this cluster's RAY_TMPDIR: everything serve-cluster started."""
    marker = f"RAY_TMPDIR={ray_tmp}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue  # ended meanwhile, or not ours to read
    return found


def stop_cluster(cluster: Cluster) -> None:
    """SIGTERM, exit 0, and nothing left behind (what is left is killed, by pid, and reported)."""
    if cluster.process.proc.poll() is None:
        assert len(our_processes(cluster.ray_tmp)) > 5, "the leak check cannot see this cluster's processes"
    code = cluster.process.stop(120)
    deadline = time.monotonic() + 30
    while (left := our_processes(cluster.ray_tmp)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(cluster.ray_tmp, ignore_errors=True)
    assert not left, f"serve-cluster left processes running after SIGTERM: {left}\n{cluster.process.output[-3000:]}"
    assert code == 0, f"serve-cluster exited with {code}:\n{cluster.process.output[-5000:]}"
