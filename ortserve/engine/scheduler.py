"""What runs this step. The only owner of request lifecycles: waiting -> running -> finished.

One rule covers prefill, chunked prefill, decode and recompute: a scheduled sequence computes the
next ``num_new_tokens`` of ``token_ids[num_computed_tokens:]``, and samples when that reaches its
last token. Each step fills a token budget (``max_num_batched_tokens``) under a sequence cap
(``max_num_seqs``):

1. running sequences first, in admission order (decodes, and prefills already under way);
   when blocks run out the newest running sequence is preempted (its blocks freed, recomputed
   later from its tokens, often from its own cached-idle blocks);
2. then waiting sequences, oldest first, with their prompt chunked to the budget left, unless
   this step preempted for blocks (no point admitting what was just evicted). A waiting sequence
   holds no blocks; on admission it takes the blocks of its longest cached prefix.

Sequence slots are shared by request: when every slot is taken and a request waits with none
running, the request holding the most slots gives its newest one back (recomputed later, mostly from
its cached blocks) and the waiting request goes first. So one request's many samples (n, best_of)
cannot hold every other client back until they all end.

Samples 1..n-1 of a request enter the waiting queue when sample 0 has its prompt in the cache,
and share its prompt blocks.

Speculative decoding (a ``proposer`` given): a decoding sequence may carry draft tokens after its
last one, computed in the same step (1 + d tokens, 1 + d logits rows); ``update`` keeps the
accepted drafts and the target's token after them, and drops the rest, whose KV slots the
sequence later overwrites. Drafts are proposed once the running sequences have their tokens, for
all decoding ones at once (a draft model runs them as one batch), unless more than
``max_drafting_seqs`` decode; they take the budget left, blocks and room under max_tokens like
tokens, and are dropped rather than preempt another sequence.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field

from ortserve.engine.block_manager import BlockManager
from ortserve.engine.ipc import EngineCoreOutput, FinishReason, TokenLogprob
from ortserve.engine.sequence import Request, Sequence, SequenceStatus
from ortserve.engine.speculative import Proposer


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    sampling: list[Sequence] = field(default_factory=list)  # those that reach their last token

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def logits_rows(self) -> list[int]:
        """Logits rows each scheduled sequence gets, in order: one per computed token while it
        wants prompt logprobs (the last doubles as its sampling row), else one if it samples,
        plus one per speculative draft."""
        return [
            n if s.wants_prompt_logprobs else (1 + s.num_draft_tokens) * int(s.num_computed_tokens + n == s.num_tokens)
            for s, n in zip(self.seqs, self.num_new_tokens)
        ]

    def __bool__(self) -> bool:
        return bool(self.seqs)


@dataclass
class SchedulerCounters:
    num_preemptions: int = 0
    num_draft_tokens: int = 0  # speculative drafts proposed
    num_accepted_tokens: int = 0  # of which the target kept
    prefix_queries: int = 0
    prefix_hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        proposer: Proposer | None = None,
        max_drafting_seqs: int | None = None,
    ):
        """``max_drafting_seqs``: no drafts in a step with more decoding sequences than this."""
        self.block_manager = block_manager
        self.proposer = proposer
        self.max_drafting_seqs = max_drafting_seqs
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.counters = SchedulerCounters()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.waiting.append(request.sequences[0])

    # -- one step --------------------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        self._share_slots()
        block_manager, running = self.block_manager, self.running
        preemptions = self.counters.num_preemptions
        i = 0
        while i < len(running) and budget > 0:
            seq = running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if not self._allocate_or_preempt(seq, num_new):
                break  # seq itself was the newest: it went back to waiting
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
            i += 1
        if self.proposer is not None and budget > 0:
            budget = self._add_drafts(batch, budget)
        preempted = self.counters.num_preemptions > preemptions
        while not preempted and self.waiting and budget > 0 and len(running) < self.max_num_seqs:
            seq = self.waiting[0]
            # prompt logprobs need the logits of every prompt token: no prefix-cache hits
            computed = [] if seq.wants_prompt_logprobs else block_manager.find_computed_blocks(seq)
            num_computed = len(computed) * block_manager.block_size
            num_new = min(seq.num_tokens - num_computed, budget)
            if not block_manager.allocate(seq, num_new, computed):
                break  # first come, first served: wait for blocks
            if block_manager.enable_prefix_caching:
                self.counters.prefix_queries += seq.num_tokens
                self.counters.prefix_hits += num_computed
            if not seq.is_prefilled:
                seq.num_cached_tokens = num_computed
            seq.num_computed_tokens = num_computed
            seq.status = SequenceStatus.RUNNING
            self.waiting.popleft()
            running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            budget -= num_new
        batch.sampling = [
            s for s, n in zip(batch.seqs, batch.num_new_tokens) if s.num_computed_tokens + n == s.num_tokens
        ]
        return batch

    def update(
        self,
        batch: ScheduledBatch,
        sampled: list[list[int]],
        logprobs: list[list[TokenLogprob] | None] | None,
    ) -> list[EngineCoreOutput]:
        """Account the computed tokens, append the sampled ones (one per sequence, or a draft's
        accepted tokens and the one after them), finish what stops."""
        block_manager = self.block_manager
        for seq, num_new in zip(batch.seqs, batch.num_new_tokens):
            seq.num_computed_tokens += num_new - seq.num_draft_tokens  # a draft's KV counts once kept
            if not seq.num_draft_tokens:
                block_manager.cache_full_blocks(seq)
        outputs = []
        any_finished = False
        for j, (seq, tokens) in enumerate(zip(batch.sampling, sampled)):
            request = seq.request
            drafted = seq.num_draft_tokens
            seq.drop_drafts()
            emitted: list[int] = []
            reason: FinishReason | None = None
            stop_reason: int | str | None = None
            prompt_logprobs = None
            for token in tokens:
                seq.append_token(token)
                emitted.append(token)
                if not seq.is_prefilled:
                    seq.is_prefilled = True
                    prompt_logprobs, seq.prompt_logprobs = seq.prompt_logprobs, None
                    if request.first_token_time is None:
                        request.first_token_time = seq.last_token_time
                        self.counters.prompt_tokens += seq.num_prompt_tokens
                    if not request.forked:  # sample 0 has the prompt in cache: the others can share it
                        self.waiting.extendleft(reversed(request.fork()))
                reason, stop_reason = self._check_stop(seq, token)
                if reason is not None:
                    break
            if drafted:  # the kept drafts' KV is in the cache; the last token's is not yet
                seq.num_computed_tokens += len(emitted) - 1
                self.counters.num_accepted_tokens += len(tokens) - 1
                block_manager.cache_full_blocks(seq)
            self.counters.generation_tokens += len(emitted)
            if reason is not None:
                self._finish(seq, reason, stop_reason)
                any_finished = True
            rows = None if logprobs is None else logprobs[j]
            last = emitted[-1]
            outputs.append(
                EngineCoreOutput(
                    request.request_id,
                    seq.index,
                    emitted,
                    None if rows is None else rows[: len(emitted)],
                    reason,
                    stop_reason,
                    seq.num_prompt_tokens,
                    seq.num_cached_tokens,
                    prompt_logprobs=prompt_logprobs,
                    finished_by_grammar=reason == "stop"
                    and seq.grammar is not None
                    and last not in request.model_eos_token_ids
                    and last not in request.stop_token_ids,
                )
            )
        if any_finished:
            self.running = [s for s in self.running if s.status is SequenceStatus.RUNNING]
        return outputs

    def abort(
        self, request_id: str, index: int | None = None, reason: FinishReason = "abort"
    ) -> list[EngineCoreOutput]:
        """End a request (or one of its samples) now; its blocks go back at once. ``reason`` is
        "abort", or "error" when processing the request failed."""
        request = self.requests.get(request_id)
        if request is None or (index is not None and not 0 <= index < request.n):
            return []
        outputs = []
        for seq in list(request.sequences):
            if seq.status is SequenceStatus.FINISHED or (index is not None and seq.index != index):
                continue
            if seq.status is SequenceStatus.RUNNING:
                self.running.remove(seq)
            else:
                self.waiting.remove(seq)
            self._finish(seq, reason, None)
            outputs.append(
                EngineCoreOutput(
                    request_id, seq.index, [], None, reason, None, seq.num_prompt_tokens, seq.num_cached_tokens
                )
            )
        if not request.forked:
            if index is None or index > 0:  # samples not forked yet end before they start
                for i in range(1, request.n) if index is None else [index]:
                    if i not in request.aborted_indices:
                        request.aborted_indices.add(i)
                        request.num_finished += 1
                        outputs.append(
                            EngineCoreOutput(request_id, i, [], None, reason, None, len(request.prompt_token_ids), 0)
                        )
                self._maybe_retire(request)
            if index == 0:  # sample 0 will not compute the prompt for the others: they do it
                self.waiting.extend(request.fork())
        return outputs

    # -- helpers ---------------------------------------------------------------------------------
    def _add_drafts(self, batch: ScheduledBatch, budget: int) -> int:
        """Draft tokens for the batch's decoding sequences, proposed for all at once, each within
        its max_tokens, the ``budget`` left (in batch order) and free blocks (drafts never
        preempt); returns the budget left."""
        assert self.proposer is not None
        decoding = [
            i
            for i, (seq, num_new) in enumerate(zip(batch.seqs, batch.num_new_tokens))
            if num_new == 1 and seq.num_computed_tokens + 1 == seq.num_tokens
        ]
        if self.max_drafting_seqs is not None and len(decoding) > self.max_drafting_seqs:
            return budget
        rows, limits = [], []
        for i in decoding:
            seq = batch.seqs[i]
            room = seq.request.max_tokens - seq.num_output_tokens - 1  # the target's own token comes too
            if seq.request.speculative and room > 0:
                rows.append(i)
                limits.append(min(room, budget))
        if not rows:
            return budget
        proposals = self.proposer.propose_batch([batch.seqs[i] for i in rows], limits)
        for i, proposal in zip(rows, proposals):
            drafts = proposal.token_ids[:budget]
            if not drafts:
                continue
            seq = batch.seqs[i]
            seq.add_drafts(drafts, None if proposal.probs is None else proposal.probs[: len(drafts)])
            if not self.block_manager.allocate(seq, 1 + len(drafts)):
                seq.drop_drafts()
                continue
            batch.num_new_tokens[i] += len(drafts)
            budget -= len(drafts)
            self.counters.num_draft_tokens += len(drafts)
        return budget

    def _share_slots(self) -> None:
        """With every slot taken, a waiting request that has none running gets one from the request
        that holds the most (if it holds more than one) and goes to the head of the queue."""
        if len(self.running) < self.max_num_seqs or not self.waiting:
            return
        held = Counter(seq.request.request_id for seq in self.running)
        newcomer = next((seq for seq in self.waiting if seq.request.request_id not in held), None)
        if newcomer is None:
            return
        hog, slots = held.most_common(1)[0]
        if slots < 2:
            return
        victim = next(seq for seq in reversed(self.running) if seq.request.request_id == hog)
        self.running.remove(victim)
        self._preempt(victim)
        self.waiting.remove(newcomer)
        self.waiting.appendleft(newcomer)

    def _allocate_or_preempt(self, seq: Sequence, num_new: int) -> bool:
        """Blocks for the next ``num_new`` tokens of a running ``seq``, preempting the newest
        running sequences until they fit. False if ``seq`` itself had to go."""
        while not self.block_manager.allocate(seq, num_new):
            victim = self.running.pop()
            self._preempt(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        self.block_manager.free(seq)
        seq.reset_for_recompute()
        self.waiting.appendleft(seq)
        self.counters.num_preemptions += 1

    def _check_stop(self, seq: Sequence, token: int) -> tuple[FinishReason | None, int | None]:
        request = seq.request
        num_out = seq.num_output_tokens
        if seq.grammar is not None:
            if not seq.grammar.consume_token(token):  # the mask allowed it: only a fault gets here
                return "error", None
            if seq.grammar.is_stopped():  # the grammar is complete: nothing else may follow
                return "stop", token if token in request.stop_token_ids else None
        if num_out >= request.params.min_tokens:
            if token in request.eos_token_ids:
                return "stop", None
            if token in request.stop_token_ids:
                return "stop", token
        if num_out >= request.max_tokens:
            return "length", None
        return None, None

    def _finish(self, seq: Sequence, reason: FinishReason, stop_reason: int | str | None) -> None:
        self.block_manager.free(seq)
        if self.proposer is not None:
            self.proposer.release(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        request = seq.request
        request.num_finished += 1
        self._maybe_retire(request)

    def _maybe_retire(self, request: Request) -> None:
        if not request.finished or request.request_id not in self.requests:
            return
        del self.requests[request.request_id]
        if request.first_token_time is None:
            return  # aborted before its first token: no latency to report
        now = time.monotonic()
        counters = self.counters
        counters.ttft.append(request.first_token_time - request.arrival_time)
        counters.e2e.append(now - request.arrival_time)
        longest = max(s.num_output_tokens for s in request.sequences)
        if longest > 1:
            last = max(s.last_token_time for s in request.sequences)
            counters.tpot.append((last - request.first_token_time) / (longest - 1))
