"""Speculative decoding: draft tokens proposed cheaply, verified by the target model in one step.

A proposer (``Proposer``) drafts for the decoding sequences of a step, all at once; the scheduler
gives each draft its budget and blocks. Two kinds: prompt lookup here, and a draft model
(``engine/draft.py``).

Proposal (``NgramProposer``, vLLM's "ngram" / prompt lookup): the sequence's last n tokens
(n from ``max_n`` down to ``min_n``) are looked up earlier in its own prompt and output; the
tokens that followed their most recent earlier occurrence are the draft. Text that copies its
input (summaries, edits, code changes, extraction) repeats long runs of the prompt, so most drafts
are right there; elsewhere the lookup finds nothing and the step is a plain decode.

Verification (``verify``) takes the target's logits at the last token and at each draft token
(1 + d rows, one step of the flattened batch) and keeps the longest accepted run of drafts plus one
token from the target: exactly what decoding token by token would produce under greedy sampling,
and the same distribution under random sampling (rejection sampling: a draft x is accepted with
probability p(x), since the n-gram proposal is deterministic; on rejection the token is drawn from
p without x, renormalised; after d accepted drafts a bonus token is drawn from the last row).
A draft drawn from a distribution q (a draft model's, under random sampling) is accepted with
probability min(1, p(x) / q(x)) instead, and on rejection the token is drawn from max(p - q, 0),
renormalised: the standard speculative sampling, exact for any q.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ortserve.engine.sequence import Sequence


@dataclass(frozen=True)
class Draft:
    token_ids: list[int]
    probs: np.ndarray | None = None  # [len(token_ids), vocab]: each token's proposal distribution; None: deterministic


class Proposer(Protocol):
    def propose_batch(self, seqs: list[Sequence], limits: list[int]) -> list[Draft]:
        """Draft tokens to follow each decoding sequence's tokens, at most ``limits[i]`` for seqs[i]."""
        ...

    def release(self, seq: Sequence) -> None:
        """``seq`` has finished: drop what the proposer keeps for it."""
        ...


@dataclass(frozen=True)
class NgramProposer:
    num_tokens: int = 4  # most draft tokens per step (k)
    min_n: int = 1
    max_n: int = 4

    def propose(self, token_ids: np.ndarray, limit: int) -> list[int]:
        """Up to ``min(num_tokens, limit)`` draft tokens to follow ``token_ids`` (int64), or []:
        the continuation of the longest earlier match of the sequence's tail (most recent first)."""
        k = min(self.num_tokens, limit)
        length = token_ids.size
        if k <= 0 or length < self.min_n + 1:
            return []
        # earlier positions holding the last token: candidate ends of a match; grow each match
        # backwards one token at a time, all candidates at once
        ends = np.flatnonzero(token_ids[: length - 1] == token_ids[length - 1])
        matched = np.ones(ends.size, dtype=np.int64)
        alive = np.ones(ends.size, dtype=bool)
        for back in range(1, min(self.max_n, length - 1)):
            alive &= (ends - back >= 0) & (token_ids[np.maximum(ends - back, 0)] == token_ids[length - 1 - back])
            matched += alive
        good = matched >= self.min_n
        if not good.any():
            return []
        best = np.flatnonzero(good & (matched == matched[good].max()))[-1]  # longest, then most recent
        draft: list[int] = token_ids[ends[best] + 1 : ends[best] + 1 + k].tolist()
        return draft

    def propose_batch(self, seqs: list[Sequence], limits: list[int]) -> list[Draft]:
        return [Draft(self.propose(np.frombuffer(s.token_ids, np.int64), limit)) for s, limit in zip(seqs, limits)]

    def release(self, seq: Sequence) -> None:
        pass  # keeps nothing per sequence
