"""Request routers for the engine replicas, on Ray Serve's extension point (``RequestRouter``).

Ray Serve routes each call of a deployment handle: ``choose_replicas`` returns ranks of replicas,
and Ray sends the request to the least-loaded replica of the first rank that has room (queue
lengths from its cache, probed when unknown, below ``max_ongoing_requests``). These routers only
say which replicas to prefer:

- ``PrefixAffinityRouter`` (the default): the replicas that were sent the longest prefix of the
  prompt (``prefix_index.py``) come first, unless their queues are longer than the shortest by more
  than ``imbalanced_threshold``; without such a prefix every replica is in one rank, so the
  least-loaded one wins. This is Ray Serve LLM's PrefixCacheAffinityRouter's policy, with the
  index kept in the router (one ingress; no actor round trip on the routing path).
- ``RoundRobinRouter``: each request to the next replica in turn, the baseline that prefix affinity
  is measured against.
- Ray's own ``PowerOfTwoChoicesRequestRouter`` (``--router power-of-two``): the least loaded of two
  random replicas.
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import (
    LocalityMixin,
    MultiplexMixin,
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from .prefix_index import DEFAULT_CHUNK_CHARS, DEFAULT_MAX_CHUNKS, PrefixIndex

POWER_OF_TWO = "ray.serve._private.request_router:PowerOfTwoChoicesRequestRouter"  # Ray's default


def prompt_of(pending_request: PendingRequest | None) -> str:
    """The routing key the ingress put on the request (``ForwardedRequest.prompt``)."""
    if pending_request is None:
        return ""
    for arg in pending_request.args:
        prompt = getattr(arg, "prompt", None)
        if isinstance(prompt, str):
            return prompt
    return ""


class PrefixAffinityRouter(LocalityMixin, MultiplexMixin, RequestRouter):
    def initialize_state(
        self,
        chunk_chars: int = DEFAULT_CHUNK_CHARS,
        max_chunks: int = DEFAULT_MAX_CHUNKS,
        imbalanced_threshold: int = 8,
        **_: Any,
    ) -> None:
        """``imbalanced_threshold``: how many more queued requests than the least-loaded replica a
        prefix holder may have and still be preferred."""
        self.index: PrefixIndex[ReplicaID] = PrefixIndex(chunk_chars, max_chunks)
        self.imbalanced_threshold = imbalanced_threshold
        self.decisions = {"prefix": 0, "least_loaded": 0}  # what the policy chose, for the logs and tests

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        everyone = random.sample(candidate_replicas, len(candidate_replicas))  # ties broken at random
        prompt = prompt_of(pending_request)
        by_id = {r.replica_id: r for r in candidate_replicas}
        match = self.index.match(prompt, by_id) if prompt else None
        if match is None or not match.replicas or self._overloaded(match.replicas, by_id):
            self.decisions["least_loaded"] += 1
            return [everyone]
        self.decisions["prefix"] += 1
        holders = [by_id[i] for i in match.replicas]
        return [holders, [r for r in everyone if r.replica_id not in match.replicas]]

    def _overloaded(self, holders: frozenset[ReplicaID], by_id: dict[ReplicaID, RunningReplica]) -> bool:
        cache = self.replica_queue_len_cache
        lengths = {i: cache.get(i) for i in by_id}
        known = [n for n in lengths.values() if n is not None]
        held = [lengths[i] for i in holders if lengths[i] is not None]
        if not known or not held:
            return False
        return min(held) - min(known) > self.imbalanced_threshold

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        prompt = prompt_of(pending_request)
        if prompt:
            self.index.insert(prompt, replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        before = set(self.curr_replicas)
        super().update_replicas(replicas)
        self.index.forget(before - set(self.curr_replicas))

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.index.forget([replica_id])


class RoundRobinRouter(RequestRouter):
    def initialize_state(self, **_: Any) -> None:
        self.turn = 0

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        return [[ordered[self.turn % len(ordered)]]] if ordered else []

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        self.turn += 1


ROUTERS: dict[str, Any] = {
    "prefix": PrefixAffinityRouter,
    "round-robin": RoundRobinRouter,
    "power-of-two": POWER_OF_TWO,
}
