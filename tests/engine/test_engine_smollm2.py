"""The engine on SmolLM2-135M-Instruct fp32, against transformers' greedy generate."""

from __future__ import annotations

import collections

import pytest

from ortserve.engine.config import EngineConfig
from ortserve.engine.core import EngineCore
from ortserve.engine.ipc import EngineRequest
from ortserve.engine.memory import GIB, MemoryCheckError
from ortserve.sampling_params import InvalidParameter, SamplingParams

pytestmark = pytest.mark.slow

MAX_NEW = 20
QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Name three primary colors.",
    "Explain in one sentence why the sky is blue.",
    "Write a short poem about the sea, the wind and a lighthouse keeper who waits for a ship.",
    "List the planets of the solar system in order from the sun, and say which one of them is the largest.",
    "Summarise this: " + "The quick brown fox jumps over the lazy dog while the cat sleeps. " * 6,
    "Translate to French, then explain the grammar: " + "I would have liked to see the museum. " * 12,
]


@pytest.fixture(scope="module")
def prompts(smollm2_tokenizer):
    ids = [
        smollm2_tokenizer.encode(
            smollm2_tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
            ),
            add_special_tokens=False,
        )
        for q in QUESTIONS
    ]
    lengths = [len(p) for p in ids]
    assert len(set(lengths)) == len(lengths) and max(lengths) > 128  # different lengths, one chunked
    return ids


@pytest.fixture(scope="module")
def expected(prompts, hf_greedy):
    """transformers' greedy tokens for every prompt, computed before any engine pins this thread."""
    return [hf_greedy(p, MAX_NEW) for p in prompts]


def make_engine(artifact, **overrides) -> EngineCore:
    config = {"model": str(artifact), "max_num_batched_tokens": 64, "max_num_seqs": 8, "kv_cache_space": 0.25}
    config.update(overrides)
    return EngineCore(EngineConfig(**config))


def drive(
    engine: EngineCore, arrivals: dict[int, list[EngineRequest]], record: list | None = None, max_steps: int = 2000
) -> dict[tuple[str, int], list[int]]:
    """Step the engine, adding the requests of ``arrivals[step]`` at that step; returns the tokens of
    every (request id, sample index). ``record`` collects each step's scheduled (request id, tokens)."""
    if record is not None:
        execute = engine.runner.execute

        def recording(batch):
            record.append([(s.request.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)])
            return execute(batch)

        engine.runner.execute = recording
    tokens: dict[tuple[str, int], list[int]] = collections.defaultdict(list)
    for step in range(max_steps):
        for request in arrivals.get(step, []):
            engine.add_request(request)
        if step > max(arrivals, default=0) and not engine.has_unfinished_requests():
            return dict(tokens)
        for out in engine.step():
            tokens[(out.request_id, out.index)] += out.new_token_ids
    raise AssertionError("the engine did not finish")


def greedy_request(request_id: str, prompt, max_tokens: int = MAX_NEW, **params) -> EngineRequest:
    return EngineRequest(request_id, list(prompt), SamplingParams(temperature=0.0, max_tokens=max_tokens, **params))


STAGGER = {0: [0, 1], 2: [2], 3: [3, 4], 7: [5], 9: [6], 15: [7]}  # arrival step -> prompts


def staggered(prompts, max_tokens=MAX_NEW):
    return {step: [greedy_request(f"p{i}", prompts[i], max_tokens) for i in idx] for step, idx in STAGGER.items()}


def test_greedy_parity_with_transformers_under_continuous_batching(smollm2_artifact, prompts, expected):
    engine = make_engine(smollm2_artifact)
    record: list = []
    tokens = drive(engine, staggered(prompts), record)
    for i, prompt in enumerate(prompts):
        assert tokens[(f"p{i}", 0)] == expected[i], f"prompt {i} ({len(prompt)} tokens)"
    mixed = [step for step in record if any(n == 1 for _, n in step) and any(n > 1 for _, n in step)]
    assert mixed, "some step must mix decodes with prefill chunks"
    chunks = [n for step in record for rid, n in step if rid == "p7" and n > 1]
    assert len(chunks) > 1, "the long prompt must be prefilled in chunks"
    engine.block_manager.check_idle()


def test_preemption_under_a_tiny_kv_budget_gives_identical_outputs(smollm2_artifact, prompts, expected):
    bytes_per_block = 16 * 2 * 30 * 3 * 64 * 2  # fp16 rows: the default cache (--kv-cache-dtype auto)
    engine = make_engine(smollm2_artifact, kv_cache_space=30 * bytes_per_block / GIB, enable_prefix_caching=False)
    assert engine.kv_plan.num_blocks == 30
    tokens = drive(engine, staggered(prompts))
    assert engine.stats().num_preemptions > 0
    for i in range(len(prompts)):
        assert tokens[(f"p{i}", 0)] == expected[i], f"prompt {i}"
    engine.block_manager.check_idle()


def test_prefix_hit_computes_only_the_remaining_tokens(smollm2_artifact, smollm2_tokenizer, hf_greedy):
    shared = smollm2_tokenizer.encode("Read the following notes carefully. " * 12)[:48]  # 3 blocks
    assert len(shared) == 48
    first = shared + smollm2_tokenizer.encode(" Question: what is 2 + 2? Answer:")
    second = shared + smollm2_tokenizer.encode(" Question: name a red fruit. Answer:")
    reference = hf_greedy(second, MAX_NEW)
    engine = make_engine(smollm2_artifact, max_num_batched_tokens=256)
    record: list = []
    drive(engine, {0: [greedy_request("first", first)]})
    tokens = drive(engine, {0: [greedy_request("second", second)]}, record)
    assert record[0] == [("second", len(second) - 48)]
    assert engine.stats().prefix_hits == 48
    assert tokens[("second", 0)] == reference
    engine.block_manager.check_idle()


def test_n_greedy_samples_share_the_prompt_and_agree(smollm2_artifact, prompts, expected):
    engine = make_engine(smollm2_artifact)
    tokens = drive(engine, {0: [greedy_request("n", prompts[3], n=3)]})
    assert [tokens[("n", i)] for i in range(3)] == [expected[3]] * 3
    engine.block_manager.check_idle()
    stats = engine.stats()
    assert (stats.prompt_tokens, stats.generation_tokens) == (len(prompts[3]), 3 * MAX_NEW)
    assert len(stats.ttft) == len(stats.tpot) == len(stats.e2e) == 1 and 0 < stats.ttft[0] < stats.e2e[0]
    assert stats.num_steps > 0 and 0 < stats.model_seconds < stats.step_seconds
    assert engine.stats().ttft == []  # latencies are drained by each call


def test_no_blocks_leak_after_aborts_at_every_stage(smollm2_artifact, prompts):
    engine = make_engine(smollm2_artifact, max_num_seqs=3)
    for i, prompt in enumerate(prompts[:6]):
        engine.add_request(greedy_request(f"a{i}", prompt, max_tokens=50, n=2 if i == 1 else 1))
    engine.step()  # a0 prefilled, a1 chunked
    engine.abort_requests(["a1", "a5"])  # one mid prefill, one still waiting
    for _ in range(3):
        engine.step()
    engine.abort_requests(["a0", ("a2", 0), "unknown"])  # one decoding, one by sample index
    outputs = engine.step()
    assert {(o.request_id, o.finish_reason) for o in outputs if o.finish_reason == "abort"} >= {
        ("a0", "abort"),
        ("a2", "abort"),
    }
    engine.abort_requests(["a3", "a4"])
    while engine.has_unfinished_requests():
        engine.step()
    engine.block_manager.check_idle()
    assert engine.stats().kv_usage == 0.0


def test_a_failed_model_run_ends_its_batch_with_errors_and_the_engine_goes_on(smollm2_artifact, prompts, expected):
    engine = make_engine(smollm2_artifact)
    for i in range(3):
        engine.add_request(greedy_request(f"e{i}", prompts[i]))
    engine.step()
    execute = engine.runner.execute

    def broken(batch):
        raise RuntimeError("simulated ORT failure")

    engine.runner.execute = broken
    outputs = engine.step()  # contained: no exception escapes the core
    engine.runner.execute = execute
    assert sorted(o.request_id for o in outputs if o.finish_reason == "error") == ["e0", "e1", "e2"]
    assert not engine.has_unfinished_requests()
    engine.block_manager.check_idle()
    tokens = drive(engine, {0: [greedy_request("after", prompts[0])]})  # still serves
    assert tokens[("after", 0)] == expected[0]


def test_a_request_whose_sampling_raises_fails_alone(smollm2_artifact, prompts, expected):
    engine = make_engine(smollm2_artifact)
    sample = engine.sampler.sample

    def faulty(logits, seqs, bitmask=None):  # a fault tied to one request, wherever it sits in the batch
        if any(s.request.request_id == "bad" for s in seqs):
            raise FloatingPointError("simulated sampler fault")
        return sample(logits, seqs, bitmask)

    engine.sampler.sample = faulty
    tokens = drive(
        engine,
        {
            0: [
                greedy_request("good0", prompts[0]),
                greedy_request("bad", prompts[1]),
                greedy_request("good2", prompts[2]),
            ]
        },
    )
    assert tokens[("good0", 0)] == expected[0] and tokens[("good2", 0)] == expected[2]
    assert tokens.get(("bad", 0), []) == []
    engine.block_manager.check_idle()


def seeded(request_id, prompt, seed=1234):
    return EngineRequest(
        request_id,
        list(prompt),
        SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=seed, max_tokens=MAX_NEW, ignore_eos=True),
    )


def test_seeded_sampling_is_reproducible_across_runs_and_batch_compositions(smollm2_artifact, prompts):
    alone = drive(make_engine(smollm2_artifact), {0: [seeded("x", prompts[1])]})[("x", 0)]
    crowd = {
        0: [seeded(f"o{i}", prompts[i], seed=None) for i in (4, 6)],
        1: [seeded("x", prompts[1])],
        2: [seeded("o7", prompts[7], seed=99), seeded("o0", prompts[0], seed=None)],
    }
    in_crowd = drive(make_engine(smollm2_artifact, max_num_batched_tokens=32), crowd)[("x", 0)]
    again = drive(make_engine(smollm2_artifact), {0: [seeded("x", prompts[1])]})[("x", 0)]
    assert alone == in_crowd == again
    other_seed = drive(make_engine(smollm2_artifact), {0: [seeded("x", prompts[1], seed=4321)]})[("x", 0)]
    assert other_seed != alone


def test_kv_budget_larger_than_memory_fails_at_start_up_naming_the_flag(smollm2_artifact):
    with pytest.raises(MemoryCheckError) as info:
        make_engine(smollm2_artifact, kv_cache_space=100_000)
    message = str(info.value)
    assert "--kv-cache-space 100000" in message
    fits = float(message.split("use --kv-cache-space ")[1].split()[0])
    assert 0 < fits < 100_000


def test_prompt_longer_than_max_model_len_is_rejected_naming_the_limit(smollm2_artifact, prompts):
    engine = make_engine(smollm2_artifact, max_model_len=64)
    with pytest.raises(
        InvalidParameter, match="65 tokens, and this model's maximum context length is 64.*--max-model-len"
    ):
        engine.add_request(greedy_request("long", list(range(65))))
    with pytest.raises(InvalidParameter, match="outside the vocabulary"):
        engine.add_request(greedy_request("bad", [10**6]))
    assert not engine.has_unfinished_requests()
    engine.block_manager.check_idle()


def test_max_model_len_larger_than_the_kv_cache_is_a_start_up_error(smollm2_artifact):
    with pytest.raises(MemoryCheckError, match="--max-model-len 4096 needs .* --kv-cache-space"):
        make_engine(smollm2_artifact, kv_cache_space=0.01, max_model_len=4096)
