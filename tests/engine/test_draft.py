"""Speculative decoding with a draft model: the draft proposes what it would say itself, from a KV
cache that always holds the tokens it claims to hold, and the target's output never changes.

The fake draft runner keeps a real paged cache of token ids (one slot per position, addressed
through the draft's block tables, as the op addresses K/V) and computes its next token from what
the cache holds: a state that claimed a stale or missing slot would change the draft's answer, and
the runner checks each history against the sequence's own tokens as well."""

from __future__ import annotations

import numpy as np
import pytest
from engine_fakes import (
    check_drafted_run,
    copying_model,
    make_request,
    run_one_drafted,
    solo,
    step_with,
    verify_with,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from ortserve.engine.block_manager import BlockManager
from ortserve.engine.draft import DraftProposer
from ortserve.engine.scheduler import Scheduler

VOCAB = 64


def draft_model(token_ids) -> int:
    """Agrees with copying_model on most histories, not all (drafts are kept, and rejected)."""
    target = copying_model(token_ids)
    return target if sum(int(t) for t in token_ids) % 5 else 10 + (target + 7) % 50


class PagedFakeRunner:
    """The draft's ModelRunner: writes each scheduled token into its cache slot, then answers from
    the slots of positions 0..last."""

    def __init__(self, model, num_blocks: int, block_size: int):
        self.model, self.block_size = model, block_size
        self.slots = np.full(num_blocks * block_size, -1, np.int64)
        self.runs = 0

    def execute(self, batch) -> np.ndarray:
        self.runs += 1
        rows = []
        for state, n in zip(batch.seqs, batch.num_new_tokens):
            start = state.num_computed_tokens
            for pos in range(start, start + n):
                self.slots[self.slot(state, pos)] = state.token_ids[pos]
            if start + n == state.num_tokens:
                history = [int(self.slots[self.slot(state, p)]) for p in range(start + n)]
                assert history == list(state.token_ids), "the draft's cache holds other tokens"
                row = np.zeros(VOCAB, np.float32)
                row[self.model(history)] = 1.0
                rows.append(row)
        return np.array(rows).reshape(len(rows), VOCAB)

    def slot(self, state, pos: int) -> int:
        return state.block_table[pos // self.block_size] * self.block_size + pos % self.block_size


def draft_proposer(num_blocks: int, block_size: int, k: int, catch_up: int) -> DraftProposer:
    runner = PagedFakeRunner(draft_model, num_blocks, block_size)
    return DraftProposer(runner, BlockManager(num_blocks, block_size, False), k, catch_up)


def checked(proposer: DraftProposer) -> DraftProposer:
    """Every proposal is the draft model's own greedy continuation of the sequence."""
    propose = proposer.propose_batch

    def propose_batch(seqs, limits):
        drafts = propose(seqs, limits)
        for seq, limit, draft in zip(seqs, limits, drafts):
            assert len(draft.token_ids) <= min(limit, proposer.num_tokens) and draft.probs is None  # greedy
            assert draft.token_ids == solo(draft_model, list(seq.token_ids), len(draft.token_ids))
        return drafts

    proposer.propose_batch = propose_batch  # type: ignore[method-assign]
    return proposer


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    block_size=st.sampled_from([1, 4, 16]),
    num_blocks=st.integers(6, 40),
    draft_blocks=st.integers(1, 40),
    budget=st.integers(1, 40),
    catch_up=st.integers(1, 40),
    k=st.integers(1, 6),
    prefix_caching=st.booleans(),
)
def test_draft_model_schedules_match_solo_runs_and_leak_nothing(
    data, block_size, num_blocks, draft_blocks, budget, catch_up, k, prefix_caching
):
    """Any budget, any cache sizes (a full draft cache only means no drafts), preemption and n > 1:
    every output is the target's alone, every draft the draft model's, and no block is kept."""
    max_model_len = num_blocks * block_size
    proposer = checked(draft_proposer(draft_blocks, block_size, k, catch_up))
    scheduler = Scheduler(BlockManager(num_blocks, block_size, prefix_caching), 4, budget, proposer)
    check_drafted_run(data.draw, scheduler, max_model_len)
    proposer.check_idle()


def test_a_good_draft_is_mostly_kept_and_saves_target_steps():
    proposer = draft_proposer(64, 4, 4, 64)
    scheduler = Scheduler(BlockManager(64, 4), 4, 64, proposer)
    steps = run_one_drafted(scheduler, [3, 4, 5, 6, 3, 4, 5, 6], 40)
    c = scheduler.counters
    assert 0 < c.num_accepted_tokens < c.num_draft_tokens
    assert c.num_accepted_tokens >= c.num_draft_tokens / 2
    assert steps < 25
    proposer.check_idle()


def test_a_long_prompt_is_caught_up_in_chunks_of_the_budget():
    """The draft reads a 100-token prompt 16 tokens a step: no drafts until it has, and no step
    runs more than 16 prompt tokens through it."""
    proposer = draft_proposer(64, 4, 3, 16)
    seen = []
    execute = proposer.runner.execute

    def recording(batch):
        seen.append(sum(batch.num_new_tokens))
        return execute(batch)

    proposer.runner.execute = recording  # type: ignore[method-assign]
    scheduler = Scheduler(BlockManager(64, 4), 4, 128, proposer)
    scheduler.add(make_request([3 + i % 4 for i in range(100)], max_tokens=20))
    drafted_at = []
    for _ in range(40):
        if not scheduler.has_unfinished_requests():
            break
        step_with(scheduler, copying_model)
        drafted_at.append(scheduler.counters.num_draft_tokens > 0)
    assert max(seen) <= 16 and drafted_at.index(True) >= 100 // 16  # the prompt first, 16 at a time
    proposer.check_idle()


def test_no_drafts_while_more_sequences_decode_than_the_limit():
    """Three requests decode together without drafts; once one is done, the other two draft."""
    proposer = draft_proposer(64, 4, 3, 64)
    scheduler = Scheduler(BlockManager(64, 4), 4, 64, proposer, max_drafting_seqs=2)
    requests = [make_request([3, 4, 5, 6] * 2, max_tokens=m) for m in (4, 30, 30)]
    for r in requests:
        scheduler.add(r)
    while scheduler.has_unfinished_requests():
        batch = scheduler.schedule()
        decoding = [s for s in batch.sampling if s.is_prefilled]
        assert len(decoding) <= 2 or not any(s.num_draft_tokens for s in batch.seqs)
        scheduler.update(batch, [verify_with(copying_model, s) for s in batch.sampling], None)
    assert scheduler.counters.num_accepted_tokens > 0
    scheduler.block_manager.check_idle()
    proposer.check_idle()


def test_a_failing_draft_run_costs_only_its_drafts():
    """Every third draft run raises: the outputs are still the target's alone, and nothing leaks."""
    proposer = draft_proposer(64, 4, 4, 64)
    execute = proposer.runner.execute

    def flaky(batch):
        if proposer.runner.runs % 3 == 2:
            proposer.runner.runs += 1
            raise RuntimeError("draft model fault")
        return execute(batch)

    proposer.runner.execute = flaky  # type: ignore[method-assign]
    scheduler = Scheduler(BlockManager(64, 4), 4, 64, proposer)
    requests = [make_request([3, 4, 5, 6, 3, 4, 5, 6], max_tokens=30), make_request([5, 6, 3], max_tokens=20)]
    outputs = {}
    for r in requests:
        scheduler.add(r)
    while scheduler.has_unfinished_requests():
        for out in step_with(scheduler, copying_model):
            outputs.setdefault(out.request_id, []).extend(out.new_token_ids)
    for r in requests:
        assert outputs[r.request_id] == solo(copying_model, r.prompt_token_ids, r.max_tokens)
    assert scheduler.counters.num_accepted_tokens > 0
    scheduler.block_manager.check_idle()
    proposer.check_idle()


# --- the engine: a real draft model changes the speed, never the greedy output ---------------------


@pytest.fixture(scope="module")
def tiny_llama_int4(tmp_path_factory, tiny_llama_checkpoint):
    """The tiny Llama at int4: a draft that agrees with the fp32 model often, not always."""
    from ortserve.export import export_model

    out = tmp_path_factory.mktemp("tiny-llama-int4") / "int4"
    export_model(tiny_llama_checkpoint, out, precision="int4", progress=False)
    return out


def test_greedy_output_with_a_draft_model_equals_plain_decoding(tiny_llama_artifact, tiny_llama_int4):
    import os

    from ortserve import LLM
    from ortserve.sampling_params import SamplingParams

    before = os.sched_getaffinity(0)
    prompts = [[100 + i % 7 for i in range(40)], list(range(200, 260)), [5, 6, 7, 8] * 5]
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True, logprobs=2)
    results, counters = {}, {}
    for label, draft in (("off", None), ("self", tiny_llama_artifact), ("int4", tiny_llama_int4)):
        options = {"draft_model": str(draft)} if draft else {}
        llm = LLM(str(tiny_llama_artifact), kv_cache_space=0.05, threads_bind="nobind", **options)
        results[label] = llm.generate(prompts, params, use_tqdm=False)
        core = llm.engine.core
        counters[label] = core.scheduler.counters
        core.block_manager.check_idle()
        if draft:
            core.scheduler.proposer.check_idle()
    os.sched_setaffinity(0, before)
    for label in ("self", "int4"):
        assert counters[label].num_accepted_tokens > 0
        for a, b in zip(results["off"], results[label]):
            assert a.outputs[0].token_ids == b.outputs[0].token_ids, label
            for x, y in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
                assert abs(x.logprob - y.logprob) < 1e-3
    # the model as its own draft is right almost always; its int4 copy less often
    own = counters["self"].num_accepted_tokens / counters["self"].num_draft_tokens
    assert own > 0.9 and counters["int4"].num_accepted_tokens <= counters["int4"].num_draft_tokens


def test_a_draft_model_samples_its_drafts_under_random_sampling(tiny_llama_artifact):
    """At temperature 0.8 the model as its own draft draws its drafts from the same distribution
    the target samples from, so p / q = 1 and nearly every draft is kept."""
    import os

    from ortserve import LLM
    from ortserve.sampling_params import SamplingParams

    before = os.sched_getaffinity(0)
    model = str(tiny_llama_artifact)
    llm = LLM(model, kv_cache_space=0.05, threads_bind="nobind", draft_model=model)
    params = SamplingParams(temperature=0.8, max_tokens=40, ignore_eos=True, seed=3)
    outputs = llm.generate([[5, 6, 7, 8] * 5, list(range(300, 340))], params, use_tqdm=False)
    os.sched_setaffinity(0, before)
    assert all(len(r.outputs[0].token_ids) == 40 for r in outputs)
    counters = llm.engine.core.scheduler.counters
    assert counters.num_draft_tokens > 20 and counters.num_accepted_tokens / counters.num_draft_tokens > 0.9
    llm.engine.core.scheduler.proposer.check_idle()


def test_min_tokens_holds_under_speculation(tiny_llama_artifact):
    """EOS biased to be every row's favourite: plain decoding gives min_tokens tokens and then EOS,
    and so do both proposers, whose drafts are checked row by row against min_tokens."""
    import os

    from ortserve import LLM
    from ortserve.sampling_params import SamplingParams

    before = os.sched_getaffinity(0)
    eos = 2
    params = SamplingParams(temperature=0.0, max_tokens=30, min_tokens=12, logit_bias={eos: 30.0})
    prompts = [[5, 6, 7, 8] * 5, list(range(300, 340))]
    outputs, drafted = {}, {}
    for label, options in (
        ("off", {}),
        ("ngram", {"speculative": "ngram"}),
        ("draft", {"draft_model": str(tiny_llama_artifact)}),
    ):
        llm = LLM(str(tiny_llama_artifact), kv_cache_space=0.05, threads_bind="nobind", **options)
        outputs[label] = [r.outputs[0].token_ids for r in llm.generate(prompts, params, use_tqdm=False)]
        drafted[label] = llm.engine.core.scheduler.counters.num_accepted_tokens
    os.sched_setaffinity(0, before)
    assert all(len(t) == 13 and t[-1] == eos and eos not in t[:-1] for t in outputs["off"])
    assert outputs["ngram"] == outputs["off"] and outputs["draft"] == outputs["off"]
    assert drafted["draft"] > 0


def test_a_draft_with_another_vocabulary_is_refused_naming_the_flag(tiny_llama_artifact, tmp_path):
    import json
    import shutil

    from ortserve.engine.config import EngineConfig
    from ortserve.engine.core import EngineCore

    other = tmp_path / "other-vocab"
    shutil.copytree(tiny_llama_artifact, other)
    manifest = json.loads((other / "ortserve.json").read_text())
    manifest["vocab_size"] += 8
    (other / "ortserve.json").write_text(json.dumps(manifest))
    config = EngineConfig(
        model=str(tiny_llama_artifact), draft_model=str(other), kv_cache_space=0.05, threads_bind="nobind"
    )
    with pytest.raises(ValueError, match=r"--draft-model .*vocabulary \(49160 tokens.*\(49152, .*same family"):
        EngineCore(config)


def test_a_missing_draft_is_refused_before_the_model_loads(tiny_llama_artifact, tmp_path, monkeypatch):
    from ortserve.engine import model_runner
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.core import EngineCore

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the draft was checked")

    monkeypatch.setattr(model_runner.ModelRunner, "__init__", no_loading)
    config = EngineConfig(model=str(tiny_llama_artifact), draft_model=str(tmp_path / "nowhere"), kv_cache_space=0.05)
    with pytest.raises(ValueError, match=r"^--draft-model .*nowhere: Unknown model"):
        EngineCore(config)


def test_the_draft_flags_go_together():
    from ortserve.engine.config import EngineConfig

    assert EngineConfig(draft_model="d").speculative == "draft"
    with pytest.raises(ValueError, match="--speculative draft needs --draft-model MODEL"):
        EngineConfig(speculative="draft")
    with pytest.raises(ValueError, match="--draft-model goes with --speculative draft, not ngram"):
        EngineConfig(speculative="ngram", draft_model="d")
