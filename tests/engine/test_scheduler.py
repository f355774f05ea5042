"""Scheduler: token budget, sequence cap, decode-first chunked prefill, preemption, prefix reuse,
abort, n samples, and no leaked blocks; checked with a deterministic fake model."""

from __future__ import annotations

from engine_fakes import (
    check_block_tables,
    fake_next_token,
    make_request,
    make_scheduler,
    run_to_completion,
    solo_outputs,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ortserve.engine.sequence import SequenceStatus


def step(scheduler):
    batch = scheduler.schedule()
    outputs = scheduler.update(batch, [[fake_next_token(s.token_ids)] for s in batch.sampling], None)
    return batch, outputs


def test_step_respects_token_budget_and_chunks_the_prompt():
    scheduler = make_scheduler(max_num_batched_tokens=16)
    scheduler.add(make_request(range(40)))
    sizes = []
    while True:
        batch, outputs = step(scheduler)
        sizes.append(batch.num_tokens)
        if outputs:
            break
    assert sizes == [16, 16, 8]  # the prompt in chunks; the token comes with the last chunk


def test_running_decodes_go_before_waiting_prefill():
    scheduler = make_scheduler(max_num_batched_tokens=10)
    first = make_request(range(6), max_tokens=20)
    scheduler.add(first)
    step(scheduler)  # first's prefill
    second = make_request(range(100, 130))
    scheduler.add(second)
    batch, _ = step(scheduler)
    assert batch.seqs[0] is first.sequences[0] and batch.num_new_tokens[0] == 1
    assert batch.seqs[1] is second.sequences[0] and batch.num_new_tokens[1] == 9
    assert batch.sampling == [first.sequences[0]]  # a partial prefill chunk samples nothing


def test_sequence_cap_holds_requests_in_waiting():
    scheduler = make_scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    requests = [make_request(range(i, i + 5)) for i in range(3)]
    for r in requests:
        scheduler.add(r)
    batch, _ = step(scheduler)
    assert len(batch.seqs) == 2 and len(scheduler.waiting) == 1
    assert requests[2].sequences[0].status is SequenceStatus.WAITING


def test_outputs_match_solo_runs_under_any_schedule():
    scheduler = make_scheduler(num_blocks=64, block_size=4, max_num_batched_tokens=7, max_num_seqs=3)
    prompts = [list(range(i, i + 3 + 5 * i)) for i in range(6)]
    ids = []
    for p in prompts:
        r = make_request(p, max_tokens=12)
        ids.append(r.request_id)
        scheduler.add(r)
    outputs = run_to_completion(scheduler)
    for rid, p in zip(ids, prompts):
        assert outputs[(rid, 0)] == solo_outputs(p, 12)
    scheduler.block_manager.check_idle()


def test_block_shortage_preempts_the_newest_and_recomputes_to_the_same_tokens():
    # 12 blocks of 4 tokens; four requests of 10 + 16 tokens cannot all be resident.
    scheduler = make_scheduler(num_blocks=12, block_size=4, max_num_batched_tokens=64, max_num_seqs=4)
    prompts = [list(range(50 * i, 50 * i + 10)) for i in range(4)]
    requests = [make_request(p, max_tokens=16) for p in prompts]
    for r in requests:
        scheduler.add(r)
    preempted_order = []
    original = scheduler._preempt

    def record(seq):
        preempted_order.append(seq.request.request_id)
        original(seq)

    scheduler._preempt = record
    outputs = run_to_completion(scheduler)
    assert scheduler.counters.num_preemptions > 0
    assert preempted_order[0] == requests[-1].request_id  # the newest goes first
    for r, p in zip(requests, prompts):
        assert outputs[(r.request_id, 0)] == solo_outputs(p, 16)
    scheduler.block_manager.check_idle()


def test_a_request_that_holds_every_slot_gives_one_to_a_request_that_waits():
    scheduler = make_scheduler(num_blocks=256, block_size=4, max_num_batched_tokens=64, max_num_seqs=4)
    hog = make_request(range(10), n=8, max_tokens=40)
    scheduler.add(hog)
    for _ in range(3):
        step(scheduler)
    assert len(scheduler.running) == 4 and {s.request for s in scheduler.running} == {hog}
    short = make_request(range(100, 105), max_tokens=3)
    scheduler.add(short)
    finished = []
    short_seq = short.sequences[0]
    outputs = run_to_completion(scheduler, on_step=lambda batch: finished.append(short_seq.finish_reason is not None))
    short_steps = finished.index(True) if True in finished else len(finished)
    assert short_steps <= 4  # admitted at once, done in its 3 tokens' steps; not after the hog's 40
    assert scheduler.counters.num_preemptions >= 1
    assert outputs[(short.request_id, 0)] == solo_outputs(list(range(100, 105)), 3)
    for seq in hog.sequences:  # the hog's preempted sample recomputes to the same tokens
        assert list(seq.token_ids[10:]) == solo_outputs(list(range(10)), 40)
    scheduler.block_manager.check_idle()


def test_prefix_hit_skips_prefill_of_shared_blocks():
    scheduler = make_scheduler(num_blocks=64, block_size=4, max_num_batched_tokens=64)
    shared = list(range(12))  # 3 blocks
    first = make_request(shared + [40, 41], max_tokens=4)
    scheduler.add(first)
    run_to_completion(scheduler)
    second = make_request(shared + [60, 61, 62], max_tokens=4)
    scheduler.add(second)
    batch, _ = step(scheduler)
    assert batch.num_new_tokens == [3]
    assert second.sequences[0].num_cached_tokens == 12
    assert scheduler.counters.prefix_hits == 12
    run_to_completion(scheduler)
    scheduler.block_manager.check_idle()


def test_abort_frees_blocks_at_once_in_any_state():
    scheduler = make_scheduler(num_blocks=32, block_size=4, max_num_batched_tokens=8, max_num_seqs=2)
    running = make_request(range(20), max_tokens=50)
    waiting = make_request(range(100, 110), max_tokens=50)
    capped = make_request(range(200, 210), max_tokens=50)
    for r in (running, waiting, capped):
        scheduler.add(r)
    step(scheduler)  # running: mid prefill; waiting: admitted with leftover budget? no: budget spent
    assert running.sequences[0].status is SequenceStatus.RUNNING
    held = scheduler.block_manager.num_available_blocks
    outs = scheduler.abort(running.request_id)
    assert [o.finish_reason for o in outs] == ["abort"]
    assert scheduler.block_manager.num_available_blocks > held
    scheduler.abort(waiting.request_id)
    scheduler.abort(capped.request_id)
    scheduler.abort("no-such-request")
    assert not scheduler.has_unfinished_requests()
    assert not scheduler.running and not scheduler.waiting
    scheduler.block_manager.check_idle()


def test_n_samples_share_the_prompt_and_finish_independently():
    scheduler = make_scheduler(num_blocks=64, block_size=4, max_num_batched_tokens=64)
    request = make_request(range(10), n=3, max_tokens=6)
    scheduler.add(request)
    batch, outputs = step(scheduler)
    assert [o.index for o in outputs] == [0]
    assert len(request.sequences) == 3
    batch, outputs = step(scheduler)  # sample 0 decodes; 1 and 2 compute their prompt tail
    assert batch.num_new_tokens == [1, 2, 2]
    leader = request.sequences[0]
    for fork in request.sequences[1:]:
        assert fork.block_table[:2] == leader.block_table[:2]
    run_to_completion(scheduler)
    assert [(s.finish_reason, s.num_output_tokens) for s in request.sequences] == [("length", 6)] * 3
    scheduler.block_manager.check_idle()


def test_abort_of_one_sample_keeps_the_others():
    scheduler = make_scheduler()
    request = make_request(range(10), n=2, max_tokens=6)
    scheduler.add(request)
    step(scheduler)
    step(scheduler)
    outs = scheduler.abort(request.request_id, index=1)
    assert [(o.index, o.finish_reason) for o in outs] == [(1, "abort")]
    assert scheduler.has_unfinished_requests()
    run_to_completion(scheduler)
    assert request.sequences[0].finish_reason == "length"
    scheduler.block_manager.check_idle()


def test_abort_before_samples_are_forked_ends_all_of_them():
    scheduler = make_scheduler()
    request = make_request(range(10), n=3)
    scheduler.add(request)
    outs = scheduler.abort(request.request_id)
    assert sorted(o.index for o in outs) == [0, 1, 2]
    assert not scheduler.has_unfinished_requests()
    scheduler.block_manager.check_idle()


def test_stop_token_and_eos_and_max_tokens_finish():
    scheduler = make_scheduler()
    prompt = list(range(5))
    stop_at = solo_outputs(prompt, 3)[2]
    by_stop = make_request(prompt, stop_token_ids=[stop_at], max_tokens=10)
    by_length = make_request(prompt, max_tokens=4)
    for r in (by_stop, by_length):
        scheduler.add(r)
    run_to_completion(scheduler)
    seq = by_stop.sequences[0]
    assert (seq.finish_reason, seq.stop_reason, seq.num_output_tokens) == ("stop", stop_at, 3)
    seq = by_length.sequences[0]
    assert (seq.finish_reason, seq.num_output_tokens) == ("length", 4)


def test_min_tokens_defers_stop_tokens():
    scheduler = make_scheduler()
    prompt = list(range(5))
    stop_at = solo_outputs(prompt, 1)[0]
    request = make_request(prompt, stop_token_ids=[stop_at], min_tokens=3, max_tokens=5)
    scheduler.add(request)
    run_to_completion(scheduler)
    assert request.sequences[0].num_output_tokens == 5


def test_max_model_len_bounds_the_output():
    scheduler = make_scheduler()
    request = make_request(range(15), max_tokens=None, max_model_len=20)
    scheduler.add(request)
    run_to_completion(scheduler)
    seq = request.sequences[0]
    assert (seq.finish_reason, seq.num_tokens) == ("length", 20)


def test_stats_count_tokens_and_latencies():
    scheduler = make_scheduler()
    for i in range(3):
        scheduler.add(make_request(range(i, i + 7), max_tokens=5))
    run_to_completion(scheduler)
    c = scheduler.counters
    assert c.prompt_tokens == 21 and c.generation_tokens == 15
    assert len(c.ttft) == len(c.e2e) == len(c.tpot) == 3
    assert all(t >= 0 for t in c.ttft + c.tpot + c.e2e)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    block_size=st.sampled_from([1, 2, 4, 16]),
    num_blocks=st.integers(4, 40),
    budget=st.integers(1, 48),
    max_num_seqs=st.integers(1, 6),
    prefix_caching=st.booleans(),
)
def test_any_workload_matches_solo_runs_and_leaks_nothing(
    data, block_size, num_blocks, budget, max_num_seqs, prefix_caching
):
    max_model_len = num_blocks * block_size
    scheduler = make_scheduler(num_blocks, block_size, max_num_seqs, budget, prefix_caching)
    requests, aborted, outputs = {}, set(), {}
    for _step in range(data.draw(st.integers(1, 60), label="steps")):
        for _ in range(data.draw(st.integers(0, 2), label="arrivals")):
            length = data.draw(st.integers(1, min(40, max_model_len)), label="prompt length")
            prompt = [data.draw(st.integers(3, 5)) for _ in range(length)]  # tiny alphabet: shared prefixes
            r = make_request(
                prompt,
                max_model_len=max_model_len,
                n=data.draw(st.integers(1, 3)),
                max_tokens=data.draw(st.integers(1, 12)),
            )
            requests[r.request_id] = r
            scheduler.add(r)
        if requests and data.draw(st.integers(0, 9), label="abort?") == 0:
            rid = data.draw(st.sampled_from(sorted(requests)))
            index = data.draw(st.sampled_from([None, 0, 1]))
            scheduler.abort(rid, index)
            aborted.add((rid, index))
        batch = scheduler.schedule()
        check_block_tables(scheduler, batch)
        sampled = [[fake_next_token(s.token_ids)] for s in batch.sampling]
        for out in scheduler.update(batch, sampled, None):
            outputs.setdefault((out.request_id, out.index), []).extend(out.new_token_ids)
    while scheduler.has_unfinished_requests():
        batch = scheduler.schedule()
        check_block_tables(scheduler, batch)
        for out in scheduler.update(batch, [[fake_next_token(s.token_ids)] for s in batch.sampling], None):
            outputs.setdefault((out.request_id, out.index), []).extend(out.new_token_ids)
    scheduler.block_manager.check_idle()
    for rid, r in requests.items():
        for seq in r.sequences:
            if seq.finish_reason == "abort":
                assert (rid, None) in aborted or (rid, seq.index) in aborted
                continue
            expected = solo_outputs(r.prompt_token_ids, r.max_tokens)
            assert outputs[(rid, seq.index)] == expected
