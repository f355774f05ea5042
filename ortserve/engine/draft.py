"""Speculative decoding with a draft model (``--speculative draft --draft-model MODEL``).

A smaller model with the target's vocabulary, or the target itself at a lower precision, proposes
the next k tokens of every decoding sequence; the target checks them in its next step with
``Sampler.verify``, as it checks prompt lookup's. Under greedy sampling the draft takes its argmax
(a deterministic proposal: the output equals plain decoding); under random sampling it draws from
its own softmax at the request's temperature and hands that distribution q on, so verification
accepts with min(1, p/q), which keeps the target's distribution exactly and accepts more often
than checking a greedy draft would (``engine/speculative.py``).

The draft has its own ``ModelRunner`` and KV cache (its own ``BlockManager``, no prefix caching)
and runs on the engine's cores between the target's steps: up to k runs a step, each one flattened
batch over the sequences it drafts for. A ``DraftState`` per sequence holds the tokens the draft
has seen and how many of them its cache holds. Each step it first catches up on what the target
added: the prompt at first (in chunks, at most ``catch_up_budget`` tokens a step over all
sequences, so a long prompt never stalls a step), then the accepted drafts and the target's own
token. Drafted tokens that the target rejected are forgotten by cutting the state back to the
longest prefix it shares with the sequence; their cache slots are written again later. A
finished sequence's state and blocks go at once (``release``); a preempted one keeps them, since
its tokens stay. A draft run that fails costs only the drafts it would have made.
"""

from __future__ import annotations

import logging
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np

from ortserve.engine.block_manager import BlockManager
from ortserve.engine.scheduler import ScheduledBatch
from ortserve.engine.speculative import Draft

if TYPE_CHECKING:
    from ortserve.artifact import ArtifactManifest
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.memory import KVCachePlan
    from ortserve.engine.sequence import Sequence
    from ortserve.engine.threads import ThreadPlan

logger = logging.getLogger("ortserve.engine")


class DraftModelError(ValueError):
    """The draft model cannot draft for this model; the message names --draft-model."""


class Runner(Protocol):
    def execute(self, batch: ScheduledBatch) -> np.ndarray: ...


@dataclass(eq=False)
class DraftState:
    """One sequence as the draft model has seen it: the attributes ``ModelRunner`` reads."""

    token_ids: array[int] = field(default_factory=lambda: array("q"))
    num_computed_tokens: int = 0  # of token_ids, in the draft's KV cache
    block_table: list[int] = field(default_factory=list)
    num_draft_tokens: int = 0  # the draft itself is never speculated on
    wants_prompt_logprobs: bool = False

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def follow(self, target: array[int]) -> None:
        """Become the target sequence's tokens, keeping the cached prefix they share."""
        n = min(len(self.token_ids), len(target))
        differ = np.flatnonzero(np.frombuffer(self.token_ids, np.int64, n) != np.frombuffer(target, np.int64, n))
        common = int(differ[0]) if differ.size else n
        self.num_computed_tokens = min(self.num_computed_tokens, common)
        del self.token_ids[common:]
        self.token_ids.extend(target[common:])


class DraftProposer:
    def __init__(self, runner: Runner, blocks: BlockManager, num_tokens: int, catch_up_budget: int):
        self.runner = runner
        self.blocks = blocks
        self.num_tokens = num_tokens  # k: most drafts per sequence and step
        self.catch_up_budget = catch_up_budget
        self.states: dict[Sequence, DraftState] = {}

    def propose_batch(self, seqs: list[Sequence], limits: list[int]) -> list[Draft]:
        tokens: list[list[int]] = [[] for _ in seqs]
        probs: list[list[np.ndarray]] = [[] for _ in seqs]
        wanted: dict[int, tuple[int, int]] = {}  # id(state) -> (index in seqs, most drafts)
        states = []
        for i, (seq, limit) in enumerate(zip(seqs, limits)):
            state = self.states.get(seq) or self.states.setdefault(seq, DraftState())  # no new state per step
            state.follow(seq.token_ids)
            if min(limit, self.num_tokens) > 0:
                wanted[id(state)] = (i, min(limit, self.num_tokens))
                states.append(state)
        budget = self.catch_up_budget  # for catching up on prompts; a step's few new tokens always go
        while states:
            scheduled, counts, done = [], [], []
            for state in states:
                behind = state.num_tokens - state.num_computed_tokens
                num_new = behind if behind <= 1 + self.num_tokens else min(behind, budget)
                if num_new <= 0 or not self.blocks.allocate(state, num_new):
                    continue  # no budget or no draft cache left: this sequence decodes without drafts now
                budget -= num_new
                scheduled.append(state)
                counts.append(num_new)
                if num_new == behind:
                    done.append(state)
            if not scheduled:
                break
            batch = ScheduledBatch(cast("list[Sequence]", scheduled), counts, cast("list[Sequence]", done))
            try:
                logits = self.runner.execute(batch)
            except Exception:  # the step goes on with the drafts so far; nothing it wrote is counted
                logger.exception("the draft model's run failed; these sequences decode without more drafts")
                break
            for state, num_new in zip(scheduled, counts):
                state.num_computed_tokens += num_new
            states = []
            for state, row in zip(done, logits):
                i, most = wanted[id(state)]
                token, q = choose(row, seqs[i])
                if token is None:
                    continue  # no finite distribution: no more drafts for it
                state.token_ids.append(token)
                tokens[i].append(token)
                if q is not None:
                    probs[i].append(q)
                if len(tokens[i]) < most:
                    states.append(state)
        return [Draft(t, np.stack(q) if q else None) for t, q in zip(tokens, probs)]

    def release(self, seq: Sequence) -> None:
        state = self.states.pop(seq, None)
        if state is not None:
            self.blocks.free(state)

    def check_idle(self) -> None:
        """With no request alive, no state is kept and every draft block is free."""
        assert not self.states, f"draft states kept for finished sequences: {list(self.states)[:5]}"
        self.blocks.check_idle()


def choose(logits: np.ndarray, seq: Sequence) -> tuple[int | None, np.ndarray | None]:
    """The draft's token for ``seq`` from its logits row: the argmax under greedy sampling (a
    deterministic proposal), else a draw from softmax(logits / temperature) with the sequence's
    generator, returned with that distribution (verification needs q). None if the row has no
    finite distribution."""
    params = seq.request.params
    if params.greedy:
        return int(logits.argmax()), None
    x = logits.astype(np.float64) / params.temperature
    x = np.exp(x - x.max())
    cdf = np.cumsum(x)
    if not np.isfinite(cdf[-1]) or cdf[-1] <= 0:
        return None, None
    token = int(min(np.searchsorted(cdf, seq.rng.random() * cdf[-1], side="right"), len(cdf) - 1))
    return token, (x / cdf[-1]).astype(np.float32)


def resolve_draft(config: EngineConfig, manifest: ArtifactManifest) -> tuple[Path, ArtifactManifest]:
    """The draft model's artifact and manifest (exported on first use), checked against the
    target's vocabulary before anything big is loaded; errors name --draft-model."""
    from ortserve.artifact import ArtifactError, load_manifest
    from ortserve.engine.core import resolve_artifact
    from ortserve.models import ModelSourceError

    assert config.draft_model is not None
    try:
        draft_dir = resolve_artifact(config.draft_model, config.draft_precision, config.activation_bits)
        draft = load_manifest(draft_dir)
    except (ModelSourceError, ArtifactError) as exc:
        raise DraftModelError(f"--draft-model {config.draft_model}: {exc}") from exc
    if draft.vocab_size != manifest.vocab_size or set(draft.eos_token_ids) != set(manifest.eos_token_ids):
        raise DraftModelError(
            f"--draft-model {config.draft_model}: its vocabulary ({draft.vocab_size} tokens, end-of-sequence "
            f"{sorted(draft.eos_token_ids)}) is not the model's ({manifest.vocab_size}, "
            f"{sorted(manifest.eos_token_ids)}); use a draft of the same family and tokenizer"
        )
    return draft_dir, draft


def load_draft_proposer(
    config: EngineConfig, draft_dir: Path, draft: ArtifactManifest, kv_plan: KVCachePlan, threads: ThreadPlan
) -> DraftProposer:
    """The draft model on the engine's cores, with a KV cache that holds as many tokens as the
    target's, after checking that its weights and cache fit in memory too."""
    from ortserve.engine.memory import GIB, available_memory, plan_kv_cache
    from ortserve.engine.model_runner import ModelRunner

    dtype = draft.kv_cache_row_dtype(config.kv_cache_dtype)  # auto: as the draft artifact takes them
    space = kv_plan.num_tokens * draft.kv_bytes_per_token(dtype) / GIB
    room = available_memory() - kv_plan.total_bytes  # the target's weights are loaded; its cache fills later
    plan = plan_kv_cache(draft, kv_plan.block_size, space, space, available=room, dtype=dtype)
    runner = ModelRunner(draft_dir, draft, plan, threads, config.max_num_seqs, shares_cores=True)
    logger.info(
        "speculative decoding: draft model %s (%s weights), %d tokens a step",
        draft_dir,
        draft.weight_precision,
        config.num_speculative_tokens,
    )
    proposer = DraftProposer(
        runner,
        BlockManager(plan.num_blocks, plan.block_size, False),
        config.num_speculative_tokens,
        config.max_num_batched_tokens,
    )
    warm_up(proposer, kv_plan.block_size + 1)
    return proposer


def warm_up(proposer: DraftProposer, length: int) -> None:
    """One throwaway proposal (ORT's first run allocates and prepacks)."""
    from ortserve.engine.ipc import EngineRequest
    from ortserve.engine.sequence import Request
    from ortserve.sampling_params import SamplingParams

    request = EngineRequest("__draft_warmup__", [0] * length, SamplingParams(max_tokens=2, temperature=0.0))
    seq = Request(request, frozenset(), length + 2).sequences[0]
    proposer.propose_batch([seq], [1])
    proposer.release(seq)
