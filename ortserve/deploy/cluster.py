"""``ortserve serve-cluster MODEL --replicas N``: engine replicas on Ray Serve behind one ingress.

    client ─HTTP─> Ray Serve proxy ─> Ingress (Litestar; routing key) ─handle─> request router
                   (--host:--port)                                          │ prefix affinity,
                                                                            ▼ else least loaded
                          EngineReplica × N (Ray actors, one per core slot) ─> ortserve serve
                          (its own /metrics)                                   (pinned to the slot)

Without ``--address`` it starts a local Ray cluster and, on SIGTERM or Ctrl-C, shuts down Serve and
that cluster. With ``--address`` it deploys onto a running cluster and, on SIGTERM, deletes its
application and leaves the cluster running. The artifact is resolved (a built-in model exported)
once, here, and every replica serves that directory: on a cluster of several machines it must be
at the same path on each (a shared file system, or copied there).
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

HELP = "serve a model from engine replicas on a Ray Serve cluster, behind one OpenAI-compatible endpoint"
APP_NAME = "ortserve"
ROUTER_CHOICES = ("prefix", "round-robin", "power-of-two")
SHUTDOWN_TIMEOUT = 60.0
PR_SET_PDEATHSIG = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ortserve.engine.config import add_engine_arguments

    parser.add_argument("model_arg", nargs="?", metavar="MODEL", default=None, help="as for `ortserve serve`")
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument(
        "--replicas",
        default="auto",
        help="engine replicas: a number, or 'auto' for one per NUMA node of this machine (default auto)",
    )
    cluster.add_argument(
        "--cores-per-replica",
        type=int,
        default=None,
        help="physical cores of each replica (default: this machine's cores shared out, never across a NUMA node)",
    )
    cluster.add_argument("--min-replicas", type=int, default=None, help="autoscaling: the fewest replicas")
    cluster.add_argument("--max-replicas", type=int, default=None, help="autoscaling: the most replicas")
    cluster.add_argument(
        "--target-ongoing-requests",
        type=float,
        default=16.0,
        help="autoscaling: requests in flight per replica to scale at (default 16)",
    )
    cluster.add_argument(
        "--max-ongoing-requests",
        type=int,
        default=64,
        help="requests in flight per replica before the router queues them (default 64)",
    )
    cluster.add_argument("--router", choices=ROUTER_CHOICES, default="prefix", help="replica choice (default prefix)")
    cluster.add_argument(
        "--ingress-replicas",
        type=int,
        default=1,
        help="ingress replicas (each routes on its own prefix index; more for many replicas; default 1)",
    )
    cluster.add_argument(
        "--attempts", type=int, default=3, help="tries per request while no replica has started it (default 3)"
    )
    cluster.add_argument("--address", default=None, help="a running Ray cluster (default: start a local one)")
    cluster.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs of the local Ray cluster (default: all this process may use)"
    )
    http = parser.add_argument_group("http")
    http.add_argument("--host", default="127.0.0.1", help="address of the ingress (default 127.0.0.1)")
    http.add_argument("--port", type=int, default=8000, help="port of the ingress (default 8000)")
    http.add_argument("--replica-host", default="127.0.0.1", help="address of each replica's own server")
    http.add_argument("--api-key", default=None, help="as for `ortserve serve` (env ORTSERVE_API_KEY)")
    http.add_argument("--served-model-name", default=None, help="as for `ortserve serve`")
    http.add_argument("--public-metrics", action="store_true", help="the replicas serve /metrics without the key")
    add_engine_arguments(parser)


class ClusterError(ValueError):
    """The flags do not make a cluster; the message names the flag."""


@dataclass(frozen=True)
class ClusterPlan:
    replicas: int
    cores_per_replica: int | None  # None: a whole NUMA node each
    cpus_per_replica: int  # Ray's logical CPUs
    autoscaling: dict[str, Any] | None


def plan_cluster(args: argparse.Namespace, nodes: list[Any]) -> ClusterPlan:
    """Replica count, slots and autoscaling bounds from the flags and this machine's topology."""
    from .placement import cores_per_replica_for, logical_cpus_per_core, plan_slots

    smt = logical_cpus_per_core(nodes)
    if args.replicas == "auto":
        replicas, cores = len(nodes), args.cores_per_replica
        if cores is None:
            cpus = max(len(n.cpus) for n in nodes)
            return _with_autoscaling(args, ClusterPlan(replicas, None, cpus, None))
    else:
        try:
            replicas = int(args.replicas)
        except ValueError:
            raise ClusterError(f"--replicas {args.replicas!r}: give a number or 'auto'") from None
        if replicas < 1:
            raise ClusterError(f"--replicas {replicas}: give at least 1")
        cores = args.cores_per_replica or cores_per_replica_for(nodes, replicas if args.address is None else 1)
    if cores < 1:
        raise ClusterError(f"--cores-per-replica {cores}: give at least 1")
    slots = len(plan_slots(nodes, cores))
    most = max(replicas, args.max_replicas or 0)
    if args.address is None and most > slots:
        raise ClusterError(
            f"{most} replicas of {cores} cores do not fit this machine's {slots} slots "
            f"({sum(len(n.cores) for n in nodes)} physical cores); lower --replicas/--max-replicas or "
            f"--cores-per-replica"
        )
    return _with_autoscaling(args, ClusterPlan(replicas, cores, cores * smt, None))


def _with_autoscaling(args: argparse.Namespace, plan: ClusterPlan) -> ClusterPlan:
    if args.min_replicas is None and args.max_replicas is None:
        return plan
    low = args.min_replicas if args.min_replicas is not None else 1
    high = args.max_replicas if args.max_replicas is not None else max(plan.replicas, low)
    if not 0 <= low <= plan.replicas <= high:
        raise ClusterError(
            f"--min-replicas {low} <= --replicas {plan.replicas} <= --max-replicas {high} does not hold; "
            f"--replicas is the count to start with"
        )
    autoscaling = {
        "min_replicas": low,
        "max_replicas": high,
        "initial_replicas": plan.replicas,
        "target_ongoing_requests": args.target_ongoing_requests,
    }
    return ClusterPlan(plan.replicas, plan.cores_per_replica, plan.cpus_per_replica, autoscaling)


def build_application(args: argparse.Namespace, plan: ClusterPlan, artifact: str) -> Any:
    """The Serve application: the ingress bound to the engine deployment."""
    from ray import serve
    from ray.serve.config import RequestRouterConfig

    from ortserve.engine.config import engine_flags
    from ortserve.models import DEFAULT_MODEL

    from .ingress import Ingress, IngressSettings
    from .replica import EngineReplica, ReplicaSpec
    from .routers import ROUTERS

    server_args = [
        "--served-model-name",
        args.served_model_name or args.model or DEFAULT_MODEL,
        *(["--api-key", args.api_key] if args.api_key else []),
        *(["--public-metrics"] if args.public_metrics else []),
        *engine_flags(args, skip=("model", "threads_bind", "reserved_cpus", "threads")),
    ]
    spec = ReplicaSpec(artifact, tuple(server_args), plan.cores_per_replica, host=args.replica_host)
    engine = serve.deployment(EngineReplica, name="EngineReplica").options(
        ray_actor_options={"num_cpus": plan.cpus_per_replica},
        max_ongoing_requests=args.max_ongoing_requests,
        request_router_config=RequestRouterConfig(request_router_class=ROUTERS[args.router]),
        health_check_period_s=5,
        health_check_timeout_s=30,
        graceful_shutdown_timeout_s=15,
        logging_config={"enable_access_log": False},
        **({"autoscaling_config": plan.autoscaling} if plan.autoscaling else {"num_replicas": plan.replicas}),
    )
    ingress = serve.deployment(serve.ingress()(Ingress), name="Ingress").options(
        num_replicas=args.ingress_replicas,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=100_000,  # it only forwards; the engine replicas' limits apply
        logging_config={"enable_access_log": False},
    )
    api_key = args.api_key or os.environ.get("ORTSERVE_API_KEY") or None
    return ingress.bind(engine.bind(spec), IngressSettings(api_key=api_key, attempts=args.attempts))


class Stop(Exception):
    """SIGTERM or SIGINT: shut down what we started."""


def _stop(*_: Any) -> None:
    raise Stop


def run(args: argparse.Namespace) -> int:
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.core import resolve_artifact
    from ortserve.engine.threads import ThreadsBindError
    from ortserve.models import ModelSourceError

    from .placement import PlacementError, usable_nodes

    if args.model_arg is not None:
        args.model = args.model_arg
    if args.threads_bind is not None or args.reserved_cpus is not None or args.threads is not None:
        print(
            "error: serve-cluster pins each replica itself: use --cores-per-replica, not --threads-bind or --threads",
            file=sys.stderr,
        )
        return 2
    for flag in ("ingress_replicas", "attempts", "max_ongoing_requests"):
        if getattr(args, flag) < 1:
            print(f"error: --{flag.replace('_', '-')} {getattr(args, flag)}: give at least 1", file=sys.stderr)
            return 2
    try:
        plan = plan_cluster(args, usable_nodes())
        config = EngineConfig.from_args(args)
        artifact = str(resolve_artifact(config.model, config.precision, config.activation_bits).resolve())
        if config.draft_model is not None:  # exported once here, not by every replica
            args.draft_model = str(
                resolve_artifact(config.draft_model, config.draft_precision, config.activation_bits).resolve()
            )
    except (ClusterError, PlacementError, ThreadsBindError, ModelSourceError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.address is None:
        return _in_own_session(lambda: _serve(args, plan, artifact))
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return _serve(args, plan, artifact)


def _in_own_session(serve_cluster: Any) -> int:
    """Run ``serve_cluster`` in a child process of its own session, and relay SIGTERM/SIGINT to it.

    The local Ray cluster's daemons (GCS, raylet) join the process group of the process that
    starts them, so a terminal's Ctrl-C or a group-wide SIGTERM (``timeout``) would kill them
    under the orderly shutdown, which then waits on them forever. In a session of its own the
    driver alone hears the signal (from us) and stops Serve, then Ray. It also stops if we die."""
    pid = os.fork()
    if pid == 0:  # the driver
        code = 1
        try:
            os.setsid()
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            signal.signal(signal.SIGTERM, _stop)
            signal.signal(signal.SIGINT, _stop)
            code = serve_cluster()
        except Stop:
            code = 0
        finally:
            sys.stdout.flush()
            os._exit(code)

    def relay(signum: int, _: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # once: the driver is already shutting down
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, relay)
    signal.signal(signal.SIGINT, relay)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def _serve(args: argparse.Namespace, plan: ClusterPlan, artifact: str) -> int:
    import ray
    from ray import serve

    from .replica import DIRECTORY_NAME, DIRECTORY_NAMESPACE, ReplicaDirectory

    local = args.address is None
    options: dict[str, Any] = {"namespace": DIRECTORY_NAMESPACE, "log_to_driver": True}
    if local:
        cpus = args.num_cpus or len(os.sched_getaffinity(0))
        options.update(num_cpus=cpus, include_dashboard=False, object_store_memory=128 * 2**20)
    try:
        ray.init(address=args.address, **options)
        signal.signal(signal.SIGTERM, _stop)  # ray.init installs its own
        # held until the end: an actor lives while a handle to it does
        directory = ray.remote(num_cpus=0)(ReplicaDirectory).options(name=DIRECTORY_NAME).remote()
        ray.get(directory.replicas.remote())
        serve.start(http_options={"host": args.host, "port": args.port})
        print(
            f"ortserve: listening on http://{args.host}:{args.port} (cluster starting; /health is 503 until a "
            f"replica is ready)",
            flush=True,
        )
        print(_describe(plan, args, artifact), flush=True)
        serve.run(build_application(args, plan, artifact), name=APP_NAME, route_prefix="/")
        print(f"ortserve: ready: {plan.replicas} replicas behind http://{args.host}:{args.port}", flush=True)
        while True:
            time.sleep(3600)
    except Stop:
        return 0
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one shutdown at a time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if ray.is_initialized():
            print("ortserve: shutting down the cluster", flush=True)
            _bounded(serve.shutdown if local else lambda: serve.delete(APP_NAME), SHUTDOWN_TIMEOUT)
            ray.shutdown()  # stops the local cluster it started; only disconnects from --address
        print("ortserve: stopped", flush=True)


def _bounded(work: Any, timeout: float) -> None:
    """Run ``work``, giving up after ``timeout`` seconds (a dead raylet makes Serve wait forever);
    what is left then ends with Ray (and each replica's server with its replica)."""
    thread = threading.Thread(target=work, name="serve-shutdown", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        print(f"ortserve: Serve did not stop within {timeout:g} s; stopping Ray", flush=True)


def _describe(plan: ClusterPlan, args: argparse.Namespace, artifact: str) -> str:
    cores = "a whole NUMA node" if plan.cores_per_replica is None else f"{plan.cores_per_replica} cores"
    scaling = (
        f", autoscaling {plan.autoscaling['min_replicas']}..{plan.autoscaling['max_replicas']}"
        if plan.autoscaling
        else ""
    )
    where = args.address or "a local Ray cluster"
    return f"ortserve: {plan.replicas} replicas of {cores} each{scaling}, router {args.router}, on {where}; {artifact}"
