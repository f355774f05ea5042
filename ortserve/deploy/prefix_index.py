"""Which replica holds which prompt prefix, as the router saw it: the state of prefix-aware routing.

An engine reuses the KV blocks of a prompt's longest cached prefix of full blocks (a hash chain,
``engine/block_manager.py``). The router cannot see tokens (tokenising happens on the replica),
so it keeps the same structure over characters: the prompt is cut into ``chunk_chars``-character
chunks (about a 16-token block at 4 characters per token), chunk i's key hashes chunk i with the
key of chunk i-1, and each key maps to the replicas that were sent a prompt containing it. A key
shared by a replica therefore means that replica was sent the whole prefix up to that chunk.

As Ray Serve LLM's PrefixCacheAffinityRouter does, this records what was routed, not what each
engine still caches; the oldest keys are forgotten past ``max_chunks`` (an LRU), so the index's
memory is bounded whatever clients send.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

R = TypeVar("R", bound=Hashable)

DEFAULT_CHUNK_CHARS = 64
DEFAULT_MAX_CHUNKS = 200_000  # a few tens of MB at most


@dataclass(frozen=True)
class PrefixMatch(Generic[R]):
    replicas: frozenset[R]  # the candidates that were sent the longest matching prefix
    matched_chars: int
    prompt_chars: int

    @property
    def rate(self) -> float:
        return self.matched_chars / self.prompt_chars if self.prompt_chars else 0.0


class PrefixIndex(Generic[R]):
    def __init__(self, chunk_chars: int = DEFAULT_CHUNK_CHARS, max_chunks: int = DEFAULT_MAX_CHUNKS) -> None:
        if chunk_chars < 1 or max_chunks < 1:
            raise ValueError(f"chunk_chars ({chunk_chars}) and max_chunks ({max_chunks}) must be at least 1")
        self.chunk_chars = chunk_chars
        self.max_chunks = max_chunks
        self._holders: OrderedDict[int, set[R]] = OrderedDict()  # chunk key -> replicas, oldest first

    def __len__(self) -> int:
        return len(self._holders)

    def keys(self, prompt: str) -> list[int]:
        """The chain of keys of the prompt's full chunks."""
        keys, key = [], 0
        for start in range(0, len(prompt) - self.chunk_chars + 1, self.chunk_chars):
            key = hash((key, prompt[start : start + self.chunk_chars]))
            keys.append(key)
        return keys

    def match(self, prompt: str, candidates: Iterable[R]) -> PrefixMatch[R]:
        """The candidates that were sent the longest prefix of ``prompt`` (none: no chunk matched)."""
        alive = frozenset(candidates)
        matched = 0
        for key in self.keys(prompt):
            holders = alive.intersection(self._holders.get(key, ()))
            if not holders:
                break
            alive, matched = holders, matched + 1
        return PrefixMatch(alive if matched else frozenset(), matched * self.chunk_chars, len(prompt))

    def insert(self, prompt: str, replica: R) -> None:
        for key in self.keys(prompt):
            holders = self._holders.get(key)
            if holders is None:
                holders = self._holders[key] = set()
            else:
                self._holders.move_to_end(key)
            holders.add(replica)
        while len(self._holders) > self.max_chunks:
            self._holders.popitem(last=False)

    def forget(self, replicas: Iterable[R]) -> None:
        """Drop replicas that left (died, scaled down): their caches are gone."""
        gone = set(replicas)
        if not gone:
            return
        for key in list(self._holders):
            holders = self._holders[key]
            holders -= gone
            if not holders:
                del self._holders[key]


def routing_key(payload: Any) -> str:
    """The text a request's prompt starts with, from its JSON body: chat messages in order (role
    and text content), or the completion prompt. Anything else routes by load alone ("")."""
    if not isinstance(payload, dict):
        return ""
    messages = payload.get("messages")
    if isinstance(messages, list):
        return "".join(_message_text(m) for m in messages)
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        prompt = prompt[0]  # a batch of prompts: the first one's prefix
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):  # token ids
        return " ".join(str(t) for t in prompt)
    return ""


def _message_text(message: Any) -> str:
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return f"<{message.get('role', '')}>{content if isinstance(content, str) else ''}"
