"""ModelRunner's graph inputs: a plain decode batch takes ``decode_inputs``, which must give exactly
what the general ``step_inputs`` gives for it; and a step's inputs reach the graph through buffers
that are reused while their shapes hold. Batches come from the real scheduler on the fake model."""

from __future__ import annotations

import numpy as np
from engine_fakes import make_request, make_scheduler, run_to_completion

from ortserve.artifact import STEP_INPUTS
from ortserve.engine.model_runner import ModelRunner


class RecordingBinding:
    """Stands in for an IOBinding: records which buffer each input name is bound to."""

    def __init__(self) -> None:
        self.bound: dict[str, np.ndarray] = {}
        self.binds = 0

    def bind_ortvalue_input(self, name, value) -> None:
        self.bound[name] = value.numpy()  # a view of the buffer the OrtValue wraps
        self.binds += 1


def runner_without_a_model(block_size: int) -> ModelRunner:
    runner = object.__new__(ModelRunner)  # only the input building is under test: no session
    runner.block_size = block_size
    runner._bound = {}
    runner.binding = RecordingBinding()  # type: ignore[assignment]
    return runner


def test_decode_inputs_equal_the_general_inputs_of_every_decode_batch():
    block_size = 4
    scheduler = make_scheduler(num_blocks=48, block_size=block_size, max_num_batched_tokens=9, max_num_seqs=5)
    for i in range(9):  # ragged prompts and lengths: chunked prefills, mixed steps, preemptions
        scheduler.add(make_request(list(range(3, 5 + 4 * i)), max_tokens=6 + 3 * i, max_model_len=48 * block_size))
    runner = runner_without_a_model(block_size)
    seen = {"decode": 0, "other": 0, "several sequences": 0}

    def check(batch) -> None:
        general = runner.step_inputs(batch)
        chosen = runner.prepare_inputs(batch)
        decode = all(
            n == 1 and s.num_computed_tokens + 1 == s.num_tokens for s, n in zip(batch.seqs, batch.num_new_tokens)
        )
        seen["decode" if decode else "other"] += 1
        seen["several sequences"] += decode and len(batch.seqs) > 1
        if decode:
            fast = runner.decode_inputs(batch)
            for graph_input in STEP_INPUTS:
                name = graph_input.name
                assert fast[name].dtype == general[name].dtype == graph_input.dtype, name
                np.testing.assert_array_equal(fast[name], general[name], err_msg=name)
        for graph_input in STEP_INPUTS:
            np.testing.assert_array_equal(chosen[graph_input.name], general[graph_input.name])

    run_to_completion(scheduler, on_step=check)
    assert seen["decode"] > 10 and seen["other"] > 5 and seen["several sequences"] > 5, seen


def test_an_input_of_the_same_shape_is_copied_into_its_bound_buffer_not_rebound():
    runner = runner_without_a_model(16)
    runner._bind_input("positions", np.array([5], np.int64))
    first = runner.binding.bound["positions"]
    caller = np.array([6], np.int64)
    runner._bind_input("positions", caller)
    assert runner.binding.binds == 1 and runner.binding.bound["positions"] is first
    np.testing.assert_array_equal(first, [6])
    caller[0] = 99  # the caller's array is not the bound one
    np.testing.assert_array_equal(first, [6])
    runner._bind_input("positions", np.array([7, 8], np.int64))  # a new shape: a new buffer
    assert runner.binding.binds == 2
    np.testing.assert_array_equal(runner.binding.bound["positions"], [7, 8])
