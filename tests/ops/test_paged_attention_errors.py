"""Bad input makes PagedAttention fail with an error naming the input and the offending values."""

from __future__ import annotations

import numpy as np
import pytest
from paged_attention_harness import build_single_op_model, make_batch, make_session, run_op

SEQS = [(1, 20), (5, 5), (3, 30)]  # rows 0 | 1..5 | 6..8


@pytest.fixture(scope="module")
def session():
    # Every dim symbolic, so the kernel's own checks (not ORT's static shape check) see bad shapes.
    return make_session(build_single_op_model(num_heads=4, num_kv_heads=2, head_size=32, all_dims_symbolic=True))


@pytest.fixture
def batch():
    return make_batch(np.random.default_rng(0), SEQS, num_heads=4, num_kv_heads=2, head_size=32, block_size=8)


def expect_error(session, batch, *fragments, alias_caches=True):
    with pytest.raises(Exception) as info:
        run_op(session, batch, alias_caches=alias_caches)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_key_width_that_disagrees_with_num_kv_heads_is_rejected(session, batch):
    batch.key = batch.key[:, :32]
    expect_error(session, batch, "key must be [T, num_kv_heads*head_size] = [9, 64]", "got [9, 32]")


def test_value_rows_that_disagree_with_query_rows_are_rejected(session, batch):
    batch.value = batch.value[:8]
    expect_error(session, batch, "value must be", "got [8, 64]")


def test_caches_of_different_shapes_are_rejected(session, batch):
    batch.value_cache = np.ascontiguousarray(batch.value_cache[:-1])
    expect_error(session, batch, "value_cache shape", "differs from key_cache shape")


def test_cache_with_wrong_head_size_is_rejected(session, batch):
    batch.key_cache = np.ascontiguousarray(batch.key_cache[..., :16])
    batch.value_cache = np.ascontiguousarray(batch.value_cache[..., :16])
    expect_error(session, batch, "key_cache must be [num_blocks, num_kv_heads=2, block_size, head_size=32]")


def test_slot_mapping_of_wrong_length_is_rejected(session, batch):
    batch.slot_mapping = batch.slot_mapping[:5]
    expect_error(session, batch, "slot_mapping must be [T] = [9], got [5]")


def test_context_lens_of_wrong_length_is_rejected(session, batch):
    batch.context_lens = batch.context_lens[:2]
    expect_error(session, batch, "context_lens must be [B] = [3]", "got [2]")


def test_query_start_loc_of_wrong_length_is_rejected(session, batch):
    batch.query_start_loc = batch.query_start_loc[:3]
    expect_error(session, batch, "query_start_loc must be [B+1] = [4], got [3]")


def test_head_size_outside_32_to_256_is_rejected():
    session = make_session(build_single_op_model(num_heads=4, num_kv_heads=2, head_size=16))
    batch = make_batch(np.random.default_rng(0), SEQS, num_heads=4, num_kv_heads=2, head_size=16, block_size=8)
    with pytest.raises(Exception, match=r"head_size .* = 16 is outside the supported range \[32, 256\]"):
        run_op(session, batch)


def test_num_heads_not_a_multiple_of_num_kv_heads_is_rejected():
    session = make_session(build_single_op_model(num_heads=3, num_kv_heads=2, head_size=32))
    batch = make_batch(np.random.default_rng(0), SEQS, num_heads=3, num_kv_heads=2, head_size=32, block_size=8)
    with pytest.raises(Exception, match=r"num_heads \(3\) must be a positive multiple of num_kv_heads \(2\)"):
        run_op(session, batch)


@pytest.mark.parametrize("bad_block", ["minus_one", "num_blocks", "huge"])
def test_block_id_out_of_range_is_rejected(session, batch, bad_block):
    num_blocks = batch.key_cache.shape[0]
    bad = {"minus_one": -1, "num_blocks": num_blocks, "huge": 10**6}[bad_block]
    batch.block_tables[2, 1] = bad
    expect_error(session, batch, f"block_tables[2][1] = {bad} is out of range", f"num_blocks = {num_blocks}")


def test_context_shorter_than_query_is_rejected(session, batch):
    batch.context_lens[1] = 4
    expect_error(session, batch, "context_lens[1] = 4 is less than the sequence's query length 5")


def test_context_beyond_block_table_capacity_is_rejected(session, batch):
    batch.context_lens[0] = 1000
    expect_error(session, batch, "context_lens[0] = 1000 exceeds block_tables capacity")


def test_non_monotonic_query_start_loc_is_rejected(session, batch):
    batch.query_start_loc[:] = [0, 6, 1, 9]
    expect_error(
        session, batch, "query_start_loc must be non-decreasing", "query_start_loc[1] = 6 > query_start_loc[2] = 1"
    )


def test_query_start_loc_not_ending_at_token_count_is_rejected(session, batch):
    batch.query_start_loc[3] = 8
    expect_error(session, batch, "query_start_loc[B=3] = 8 must equal the number of query rows T = 9")


def test_query_start_loc_not_starting_at_zero_is_rejected(session, batch):
    batch.query_start_loc[0] = 1
    expect_error(session, batch, "query_start_loc[0] = 1, must be 0")


@pytest.mark.parametrize("bad_slot", [-2, 10**9])
def test_slot_outside_the_cache_is_rejected(session, batch, bad_slot):
    batch.slot_mapping[4] = bad_slot
    expect_error(session, batch, f"slot_mapping[4] = {bad_slot} is outside the cache")


def test_cache_output_not_bound_to_the_cache_input_is_rejected(session, batch):
    expect_error(
        session,
        batch,
        "key_cache_out/value_cache_out must be the same OrtValue as key_cache/value_cache",
        alias_caches=False,
    )


def test_rejected_input_leaves_the_cache_untouched(session, batch):
    before = batch.key_cache.copy()
    batch.block_tables[0, 0] = -5
    expect_error(session, batch, "block_tables[0][0] = -5")
    np.testing.assert_array_equal(batch.key_cache, before)
