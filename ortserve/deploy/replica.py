"""One engine replica of ``ortserve serve-cluster``: an ``ortserve serve`` process on its core slot.

The replica is a Ray Serve deployment replica (a Ray actor). It takes the core slot of its number
on its machine (``placement.py``), starts the existing server there (``ortserve serve ARTIFACT
--threads-bind CORES``, its CPU affinity limited to the slot, so the HTTP process stays off the
other replicas' cores; the engine binds its memory to the slot's NUMA node), waits for /health,
and forwards what the ingress routes to it: one ``ResponseHead``, then the body's bytes as they
come, so streams stay streams. The server keeps its own supervision (engine restarts, admission,
drain); a server that dies fails ``check_health``, and Ray Serve replaces the replica.

The server dies with the replica: it gets SIGTERM when the replica's process ends (PR_SET_PDEATHSIG),
however it ends, and its engine process ends when the server's pipe closes.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx

from .placement import Slot

logger = logging.getLogger("ortserve.replica")

LISTENING = re.compile(r"listening on (http://[\d.]+:\d+)")
PR_SET_PDEATHSIG = 1
# Response headers that belong to one hop; the ingress sets its own.
HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}
FORWARDED_REQUEST_HEADERS = ("authorization", "content-type", "accept", "x-request-id")
DIRECTORY_NAME = "ortserve-replicas"
DIRECTORY_NAMESPACE = "ortserve"
HEARTBEAT_S = 2.0
UNHEALTHY_GRACE = 120.0  # seconds of /health 503 (an engine restarting) before Ray replaces the replica


@dataclass(frozen=True)
class ForwardedRequest:
    """An HTTP request as the ingress hands it to a replica; ``prompt`` is the routing key (Ray
    Serve LLM's prefix router reads ``.prompt`` the same way)."""

    method: str
    path: str
    body: bytes
    headers: tuple[tuple[str, str], ...]
    prompt: str = ""


@dataclass(frozen=True)
class ResponseHead:
    status: int
    headers: tuple[tuple[str, str], ...]
    replica: str
    # Nothing of this request ran and another replica may serve it: the server is unreachable,
    # or answered 503 (its engine loading or restarting).
    retry_elsewhere: bool = False


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica starts with (built by ``serve-cluster`` from its flags)."""

    artifact: str
    server_args: tuple[str, ...] = ()  # more `ortserve serve` flags (engine flags, --api-key, ...)
    cores_per_replica: int | None = None  # None: the slot is a whole NUMA node (--replicas auto)
    startup_timeout: float = 600.0
    host: str = "127.0.0.1"  # where the replica's own server listens (its /metrics)


@dataclass(frozen=True)
class ReplicaInfo:
    replica_id: str
    node_ip: str
    pid: int  # the replica's (Ray actor's) process
    server_pid: int
    url: str  # the replica's own ortserve server: /metrics, /health
    cores: tuple[int, ...]
    numa_node: int
    local_rank: int
    seen: float = field(default=0.0, compare=False)  # set by the directory


class ReplicaServer:
    """The ``ortserve serve`` process of one replica."""

    def __init__(self, spec: ReplicaSpec, slot: Slot) -> None:
        argv = [
            sys.executable,
            "-m",
            "ortserve.cli",
            "serve",
            spec.artifact,
            "--host",
            spec.host,
            "--port",
            "0",
            "--threads-bind",
            slot.threads_bind,
            "--drain-timeout",
            "5",
            *spec.server_args,
        ]
        cores = set(slot.cores)
        libc = ctypes.CDLL(None)  # loaded before the fork: the child only makes two system calls

        def in_child() -> None:
            os.sched_setaffinity(0, cores)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

        self.lines: list[str] = []
        self.url: str | None = None
        self._listening = threading.Event()
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # PDEATHSIG fires when the forking thread ends: this runs on the replica's own event-loop
            # thread, which lives as long as the replica.
            preexec_fn=in_child,
            start_new_session=True,
        )
        threading.Thread(target=self._relay, name="replica-server-log", daemon=True).start()

    def _relay(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines = [*self.lines[-199:], line]
            match = LISTENING.search(line)
            if match and self.url is None:
                self.url = match.group(1)
                self._listening.set()
            print(f"[server {self.proc.pid}] {line}", end="", flush=True)  # Ray sends it to the driver's log

    async def wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient(timeout=5) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(
                        f"the replica's ortserve server exited with code {self.proc.returncode}:\n"
                        + "".join(self.lines[-30:])
                    )
                if self.url is not None:
                    try:
                        if (await client.get(f"{self.url}/health")).status_code == 200:
                            return self.url
                    except httpx.HTTPError:
                        pass
                await asyncio.sleep(0.2)
        last = "".join(self.lines[-30:])
        raise RuntimeError(f"the replica's ortserve server was not ready after {timeout:g} s:\n{last}")

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
                return
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the server's own session: it and its engine
        except ProcessLookupError:
            pass
        self.proc.wait()


class EngineReplica:
    """The Ray Serve deployment class (``serve-cluster`` wraps it with ``serve.deployment``)."""

    async def __init__(self, spec: ReplicaSpec) -> None:
        import ray
        from ray import serve

        from .placement import slot_for, usable_nodes

        context = serve.get_replica_context()
        self.replica_id = context.replica_id.unique_id
        local_rank = context.rank.local_rank if context.rank is not None else 0
        slot = slot_for(local_rank, usable_nodes(), spec.cores_per_replica)
        self.server = ReplicaServer(spec, slot)
        url = await self.server.wait_ready(spec.startup_timeout)
        self.client = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(None, connect=5))
        self._unhealthy_since: float | None = None
        self.info = ReplicaInfo(
            self.replica_id,
            ray.util.get_node_ip_address(),
            os.getpid(),
            self.server.proc.pid,
            url,
            slot.cores,
            slot.numa_node,
            local_rank,
        )
        print(
            f"ortserve replica {self.replica_id}: server {url} (pid {self.server.proc.pid}) on cores "
            f"{slot.threads_bind}, NUMA node {slot.numa_node}",
            flush=True,
        )
        try:
            self.directory = ray.get_actor(DIRECTORY_NAME, namespace=DIRECTORY_NAMESPACE)
        except ValueError:
            self.directory = None  # deployed without serve-cluster's directory: nothing to report to
        self._heartbeat = asyncio.create_task(self._beat())

    async def _beat(self) -> None:
        while self.directory is not None:
            try:
                await self.directory.beat.remote(self.info)
            except Exception as exc:  # noqa: BLE001 - the directory went away (serve-cluster is stopping)
                logger.warning("replica %s: the directory did not answer: %s", self.replica_id, exc)
            await asyncio.sleep(HEARTBEAT_S)

    async def __call__(self, request: ForwardedRequest) -> AsyncIterator[ResponseHead | bytes]:
        headers = [(k, v) for k, v in request.headers if k.lower() in FORWARDED_REQUEST_HEADERS]
        outgoing = self.client.build_request(request.method, request.path, content=request.body, headers=headers)
        try:
            response = await self.client.send(outgoing, stream=True)
        except httpx.TransportError as exc:
            logger.warning("replica %s: its server did not take the request: %s", self.replica_id, exc)
            yield ResponseHead(503, (("content-type", "application/json"),), self.replica_id, retry_elsewhere=True)
            yield b'{"error": {"message": "no replica could take the request; retry", "type": "unavailable"}}'
            return
        try:
            kept = tuple((k, v) for k, v in response.headers.items() if k.lower() not in HOP_HEADERS)
            yield ResponseHead(response.status_code, kept, self.replica_id, response.status_code == 503)
            async for chunk in response.aiter_raw():
                yield chunk
        finally:
            await response.aclose()  # also when the ingress cancels: the server sees the client leave

    async def check_health(self) -> None:
        """Ray Serve calls this every few seconds; three failures in a row replace the replica. A
        server that exited fails at once; a /health of 503 only after UNHEALTHY_GRACE seconds,
        since the server restarts a dead engine itself (and gives up, exiting, past its limit)."""
        code = self.server.proc.poll()
        if code is not None:
            raise RuntimeError(f"replica {self.replica_id}: its ortserve server exited with code {code}")
        status = (await self.client.get("/health", timeout=10)).status_code
        if status == 200:
            self._unhealthy_since = None
            return
        self._unhealthy_since = self._unhealthy_since or time.monotonic()
        if time.monotonic() - self._unhealthy_since > UNHEALTHY_GRACE:
            raise RuntimeError(
                f"replica {self.replica_id}: its ortserve server's /health has been {status} for "
                f"{time.monotonic() - self._unhealthy_since:.0f} s"
            )

    def __del__(self) -> None:
        heartbeat = getattr(self, "_heartbeat", None)
        if heartbeat is not None:
            heartbeat.cancel()
        directory = getattr(self, "directory", None)
        if directory is not None:
            directory.leave.remote(self.replica_id)
        server = getattr(self, "server", None)
        if server is not None:
            server.stop()


class ReplicaDirectory:
    """The replicas that reported in the last few heartbeats (a named Ray actor owned by
    ``serve-cluster``): what ``GET /cluster`` and the ingress's /health read."""

    def __init__(self, ttl: float = 3 * HEARTBEAT_S) -> None:
        self.ttl = ttl
        self.entries: dict[str, ReplicaInfo] = {}

    def beat(self, info: ReplicaInfo) -> None:
        self.entries[info.replica_id] = ReplicaInfo(**{**info.__dict__, "seen": time.monotonic()})

    def leave(self, replica_id: str) -> None:
        self.entries.pop(replica_id, None)

    def replicas(self) -> list[ReplicaInfo]:
        now = time.monotonic()
        return sorted((i for i in self.entries.values() if now - i.seen < self.ttl), key=lambda i: i.local_rank)
