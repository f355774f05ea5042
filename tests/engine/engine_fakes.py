"""Helpers for the engine tests (imported as a module, not a conftest): requests without a model,
and a deterministic fake model.

The fake model's next token is a pure function of the whole token history, so any schedule
(chunked, preempted, recomputed, batched differently) must give the same tokens as running each
request alone: that is what the scheduler tests check.
"""

from __future__ import annotations

import collections
import itertools

from ortserve.engine.block_manager import BlockManager
from ortserve.engine.ipc import EngineRequest
from ortserve.engine.scheduler import Scheduler
from ortserve.engine.sequence import Request
from ortserve.sampling_params import SamplingParams

EOS = 2
_ids = itertools.count()


def fake_next_token(token_ids) -> int:
    """A 'model': the next token from the whole history (never EOS)."""
    h = 0
    for t in token_ids:
        h = (h * 1_000_003 + int(t)) % 2_147_483_647
    return 10 + h % 1000


def make_request(prompt, request_id: str | None = None, max_model_len: int = 4096, **params) -> Request:
    params.setdefault("max_tokens", 8)
    params.setdefault("temperature", 0.0)
    engine_request = EngineRequest(request_id or f"req-{next(_ids)}", list(prompt), SamplingParams(**params))
    return Request(engine_request, frozenset({EOS}), max_model_len)


def run_to_completion(scheduler: Scheduler, max_steps: int = 10_000, on_step=None) -> dict:
    """Drive the scheduler with the fake model; returns {(request_id, index): output tokens}."""
    outputs: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests():
            return dict(outputs)
        batch = scheduler.schedule()
        check_block_tables(scheduler, batch)
        if on_step is not None:
            on_step(batch)
        sampled = [[fake_next_token(s.token_ids)] for s in batch.sampling]
        for out in scheduler.update(batch, sampled, None):
            outputs[(out.request_id, out.index)].extend(out.new_token_ids)
    raise AssertionError("requests did not finish")


def check_block_tables(scheduler: Scheduler, batch) -> None:
    """Every scheduled sequence has blocks for the tokens it will hold after the step, and every
    block's ref count equals the number of live sequences that hold it."""
    bm = scheduler.block_manager
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        assert len(seq.block_table) * bm.block_size >= seq.num_computed_tokens + n
    holders = collections.Counter(b for s in scheduler.running for b in s.block_table)
    for block in bm.blocks:
        assert block.ref_count == holders.get(block.block_id, 0), f"block {block.block_id}"
        assert (block.ref_count == 0) == (block.block_id in bm.free_queue)


def solo_outputs(prompt, max_tokens: int) -> list[int]:
    tokens = list(prompt)
    out = []
    for _ in range(max_tokens):
        t = fake_next_token(tokens)
        tokens.append(t)
        out.append(t)
    return out


def make_scheduler(
    num_blocks=64, block_size=4, max_num_seqs=8, max_num_batched_tokens=32, prefix_caching=True
) -> Scheduler:
    """Requests for it must come from make_request(..., max_model_len <= num_blocks * block_size)."""
    bm = BlockManager(num_blocks, block_size, prefix_caching)
    return Scheduler(bm, max_num_seqs, max_num_batched_tokens)


# --- speculative decoding: a target that copies, so drafts are often right ---------------------


def copying_model(token_ids) -> int:
    """A pure function of the history that mostly repeats what came 3 tokens back (prompt lookup
    finds it) and sometimes says something new (drafts get rejected)."""
    h = 0
    for t in token_ids:
        h = (h * 1_000_003 + int(t)) % 2_147_483_647
    return int(token_ids[-3]) if len(token_ids) >= 3 and h % 4 else 10 + h % 50


def step_with(scheduler, model) -> list:
    """One step with ``model`` as the target; after it every sequence that sampled has exactly its
    last token left to compute (a kept draft's KV counts, a dropped one's does not)."""
    batch = scheduler.schedule()
    check_block_tables(scheduler, batch)
    outputs = scheduler.update(batch, [verify_with(model, s) for s in batch.sampling], None)
    for seq in batch.sampling:
        if seq in scheduler.running:
            assert seq.num_computed_tokens == seq.num_tokens - 1 and seq.num_draft_tokens == 0
    return outputs


def verify_with(model, seq) -> list[int]:
    """What Sampler.verify does under greedy sampling, with ``model`` as the target."""
    drafts = seq.draft_token_ids
    history = list(seq.token_ids[: len(seq.token_ids) - len(drafts)])
    out = []
    for j in range(len(drafts) + 1):
        token = model(history)
        out.append(token)
        if j == len(drafts) or token != drafts[j]:
            break
        history.append(token)
    return out


def solo(model, prompt, max_tokens):
    tokens, out = list(prompt), []
    for _ in range(max_tokens):
        tokens.append(model(tokens))
        out.append(tokens[-1])
    return out


def check_drafted_run(draw, scheduler, max_model_len: int) -> None:
    """Add 1-5 drawn requests (``draw``: hypothesis' data.draw), run them with copying_model as the
    target, and check every output is the target's alone and no block is kept; drafts may only
    change the speed."""
    from hypothesis import strategies as st

    requests = []
    for _ in range(draw(st.integers(1, 5), label="requests")):
        length = draw(st.integers(1, min(30, max_model_len - 1)), label="prompt length")
        prompt = [draw(st.integers(3, 6)) for _ in range(length)]
        n, max_tokens = draw(st.integers(1, 2)), draw(st.integers(1, 24))
        requests.append(make_request(prompt, max_model_len=max_model_len, n=n, max_tokens=max_tokens))
        scheduler.add(requests[-1])
    outputs: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for _ in range(5000):
        if not scheduler.has_unfinished_requests():
            break
        for out in step_with(scheduler, copying_model):
            outputs[(out.request_id, out.index)].extend(out.new_token_ids)
    scheduler.block_manager.check_idle()
    for r in requests:
        for seq in r.sequences:
            assert outputs[(r.request_id, seq.index)] == solo(copying_model, r.prompt_token_ids, r.max_tokens)
    assert scheduler.counters.num_accepted_tokens <= scheduler.counters.num_draft_tokens


def run_one_drafted(scheduler, prompt, max_tokens: int) -> int:
    """Run one request to the end with copying_model as the target; returns the number of steps
    (checks it got all its tokens)."""
    scheduler.add(make_request(prompt, max_tokens=max_tokens))
    steps = outputs = 0
    while scheduler.has_unfinished_requests():
        outputs += sum(len(o.new_token_ids) for o in step_with(scheduler, copying_model))
        steps += 1
    assert outputs == max_tokens
    return steps
