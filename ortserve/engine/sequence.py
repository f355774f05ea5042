"""Request state in the engine core: a Request and its n Sequences (one per sample).

A Sequence is a token list plus how much of it is in the KV cache (``num_computed_tokens``),
so prefill, chunked prefill, decode and recompute after preemption are one rule: each step
computes some of ``token_ids[num_computed_tokens:]``. The scheduler alone changes ``status``
and the token counts; the block manager alone changes ``block_table``.
"""

from __future__ import annotations

import enum
import hashlib
import time
from array import array
from collections.abc import Callable
from typing import Any

import numpy as np

from ortserve.engine.ipc import EngineRequest, FinishReason, TokenLogprob
from ortserve.sampling_params import SamplingParams


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Request:
    """One EngineRequest: its parameters, its samples and its timings."""

    def __init__(
        self,
        request: EngineRequest,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        new_grammar: Callable[[], Any] | None = None,
    ):
        """``new_grammar``: makes a sample's grammar matcher in its start state (structured outputs)."""
        self.request_id = request.request_id
        self.prompt_token_ids = list(request.prompt_token_ids)
        self.params: SamplingParams = request.sampling_params
        self.arrival_time = request.arrival_time
        params = self.params
        # as vLLM: a sequence ends at max_model_len tokens; a prompt of exactly max_model_len
        # still gets one token (the last sampled token never needs KV)
        room = max(max_model_len - len(self.prompt_token_ids), 1)
        self.max_tokens = room if params.max_tokens is None else min(params.max_tokens, room)
        self.eos_token_ids = frozenset() if params.ignore_eos else eos_token_ids
        self.model_eos_token_ids = eos_token_ids  # a grammar may end on EOS even with ignore_eos
        self.new_grammar = new_grammar
        self.stop_token_ids = frozenset(params.stop_token_ids or ())
        # speculative drafts are checked with position-free processors only (engine/speculative.py)
        self.speculative = not params.needs_penalties and params.structured_outputs is None
        # tokens masked while fewer than min_tokens are out (vLLM masks EOS and stop ids)
        self.min_tokens_mask = np.array(sorted(eos_token_ids | self.stop_token_ids), dtype=np.int64)
        self.sequences = [Sequence(self, 0, _rng(params.seed, 0))]
        self.num_finished = 0
        self.forked = self.n == 1  # samples 1..n-1 exist
        self.aborted_indices: set[int] = set()  # samples aborted before they were forked
        self.first_token_time: float | None = None
        # sampler inputs that never change: logit_bias as arrays, the prompt's distinct tokens
        bias = params.logit_bias or {}
        self.bias_ids = np.fromiter(bias.keys(), dtype=np.int64, count=len(bias))
        self.bias_values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))
        self.prompt_uniques = (
            np.unique(np.asarray(self.prompt_token_ids, dtype=np.int64)) if params.repetition_penalty != 1.0 else None
        )

    @property
    def n(self) -> int:
        return self.params.n

    @property
    def finished(self) -> bool:
        return self.num_finished == self.n

    def fork(self) -> list[Sequence]:
        """The samples 1..n-1, made once sample 0 has its prompt in the cache."""
        forks = [
            Sequence(self, i, _rng(self.params.seed, i)) for i in range(1, self.n) if i not in self.aborted_indices
        ]
        self.sequences.extend(forks)
        self.forked = True
        return forks


def _rng(seed: int | None, index: int) -> np.random.Generator:
    # One generator per sample: its draws depend only on its own seed, never on the batch.
    return np.random.default_rng(None if seed is None else [seed & 0xFFFF_FFFF_FFFF_FFFF, index])  # any int64 seed


class Sequence:
    __slots__ = (
        "block_hashes",
        "block_table",
        "draft_probs",
        "finish_reason",
        "grammar",
        "index",
        "is_prefilled",
        "last_token_time",
        "num_cached_tokens",
        "num_computed_tokens",
        "num_draft_tokens",
        "num_prompt_tokens",
        "output_counts",
        "prompt_logprobs",
        "request",
        "rng",
        "status",
        "stop_reason",
        "token_ids",
    )

    def __init__(self, request: Request, index: int, rng: np.random.Generator):
        self.request = request
        self.index = index
        self.token_ids = array("q", request.prompt_token_ids)
        self.num_prompt_tokens = len(request.prompt_token_ids)
        self.num_computed_tokens = 0
        self.block_table: list[int] = []
        self.block_hashes: list[bytes] = []  # hash chain over full blocks of token_ids, grown lazily
        self.status = SequenceStatus.WAITING
        self.rng = rng
        self.output_counts: dict[int, int] | None = {} if request.params.needs_penalties else None
        self.num_cached_tokens = 0
        self.finish_reason: FinishReason | None = None
        self.stop_reason: int | str | None = None
        self.last_token_time = 0.0
        self.is_prefilled = False  # has sampled its first token at least once
        self.num_draft_tokens = 0  # speculative drafts at the end of token_ids, this step only
        self.draft_probs: np.ndarray | None = None  # [drafts, vocab]: the distribution each was drawn from
        # an llguidance matcher when the request has structured outputs: advanced by each sampled
        # token, never by recompute, so preemption leaves it as it is
        self.grammar: Any = request.new_grammar() if request.new_grammar is not None else None
        # prompt logprobs gathered so far, entry j for prompt token j + 1 (chunked prefill adds up)
        self.prompt_logprobs: list[TokenLogprob] | None = (
            [] if index == 0 and request.params.prompt_logprobs is not None else None
        )

    def __repr__(self) -> str:
        return (
            f"Sequence({self.request.request_id}#{self.index}, tokens={len(self.token_ids)}, "
            f"computed={self.num_computed_tokens}, blocks={len(self.block_table)}, {self.status.value})"
        )

    @property
    def params(self) -> SamplingParams:
        return self.request.params

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Needs a logits row for each prompt token it computes (sample 0 of a request that asked,
        until its prompt is done)."""
        return self.prompt_logprobs is not None and not self.is_prefilled

    @property
    def draft_token_ids(self) -> list[int]:
        return self.token_ids[len(self.token_ids) - self.num_draft_tokens :].tolist() if self.num_draft_tokens else []

    def add_drafts(self, token_ids: list[int], probs: np.ndarray | None = None) -> None:
        """Speculative drafts, computed this step like tokens, then dropped by ``drop_drafts``;
        ``probs``: the distribution each was drawn from (None: chosen deterministically)."""
        self.token_ids.extend(token_ids)
        self.num_draft_tokens = len(token_ids)
        self.draft_probs = probs

    def drop_drafts(self) -> None:
        if self.num_draft_tokens:
            del self.token_ids[len(self.token_ids) - self.num_draft_tokens :]
            self.num_draft_tokens = 0
            self.draft_probs = None

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        if self.output_counts is not None:
            self.output_counts[token_id] = self.output_counts.get(token_id, 0) + 1
        self.last_token_time = time.monotonic()

    def full_block_hashes(self, num_blocks: int, block_size: int) -> list[bytes]:
        """Hashes of the first ``num_blocks`` full blocks: block i's hash covers its tokens and
        the hash of block i-1, so equal hashes mean equal prefixes."""
        hashes = self.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            h = hashlib.sha256(hashes[-1] if hashes else b"")
            h.update(self.token_ids[i * block_size : (i + 1) * block_size].tobytes())
            hashes.append(h.digest())
        return hashes[:num_blocks]

    def reset_for_recompute(self) -> None:
        """Preempted: the KV is gone, the tokens stay (prompt + output are recomputed as one prefill)."""
        self.drop_drafts()
        self.num_computed_tokens = 0
        self.status = SequenceStatus.WAITING
