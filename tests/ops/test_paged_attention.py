"""PagedAttention matches its numpy reference (the spec) on every batch shape and option."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ortserve.ops.paged_attention_reference import paged_attention as reference
from paged_attention_harness import cached_session, make_batch, run_op


def check_against_reference(
    seqs,
    *,
    num_heads,
    num_kv_heads,
    head_size,
    block_size,
    scale=0.0,
    sliding_window=0,
    softcap=0.0,
    skip_fraction=0.0,
    seed=0,
):
    rng = np.random.default_rng(seed)
    batch = make_batch(
        rng,
        seqs,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        skip_fraction=skip_fraction,
    )
    expected_batch = batch.copy()
    attrs = dict(scale=scale, sliding_window=sliding_window, softcap=softcap)
    expected = reference(*vars(expected_batch).values(), num_heads=num_heads, num_kv_heads=num_kv_heads, **attrs)
    got = run_op(cached_session(num_heads, num_kv_heads, head_size, **attrs), batch)
    assert got.shape == expected.shape
    err = np.abs(got - expected).max(initial=0.0)
    assert err <= 1e-4 * max(np.abs(expected).max(initial=0.0), 1e-6), f"max abs error {err}"
    np.testing.assert_array_equal(batch.key_cache, expected_batch.key_cache)
    np.testing.assert_array_equal(batch.value_cache, expected_batch.value_cache)


PREFILL = [(37, 37)]
CHUNKED_PREFILL = [(20, 53)]
DECODE = [(1, 1), (1, 40), (1, 17)]
MIXED = [(1, 30), (12, 12), (1, 1), (9, 70), (1, 33)]


@pytest.mark.parametrize(
    "seqs", [PREFILL, CHUNKED_PREFILL, DECODE, MIXED], ids=["prefill", "chunked_prefill", "decode", "mixed"]
)
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (14, 2)], ids=["mha", "gqa3", "gqa7"])
def test_every_batch_shape_and_gqa_ratio_matches_reference(seqs, num_heads, num_kv_heads):
    check_against_reference(seqs, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=64, block_size=16)


@pytest.mark.parametrize("head_size", [32, 64, 80, 128, 256])
@pytest.mark.parametrize("block_size", [8, 16, 32])
def test_every_head_and_block_size_matches_reference(head_size, block_size):
    check_against_reference(MIXED, num_heads=6, num_kv_heads=2, head_size=head_size, block_size=block_size)


@pytest.mark.parametrize("sliding_window", [1, 5, 16, 1000])
def test_sliding_window_limits_attention_to_recent_positions(sliding_window):
    check_against_reference(
        MIXED + CHUNKED_PREFILL, num_heads=6, num_kv_heads=2, head_size=64, block_size=8, sliding_window=sliding_window
    )


def test_softcap_squashes_scores_after_scaling():
    check_against_reference(MIXED, num_heads=6, num_kv_heads=2, head_size=64, block_size=16, softcap=2.0, scale=0.5)


def test_explicit_scale_replaces_inverse_sqrt_head_size():
    check_against_reference(MIXED, num_heads=4, num_kv_heads=4, head_size=64, block_size=16, scale=0.3)


def test_slot_minus_one_leaves_the_cache_untouched():
    check_against_reference(
        MIXED + PREFILL, num_heads=6, num_kv_heads=2, head_size=64, block_size=16, skip_fraction=0.3
    )


def test_long_single_decode_is_split_across_threads_and_still_exact():
    check_against_reference([(1, 3000)], num_heads=14, num_kv_heads=2, head_size=64, block_size=16)


def test_long_decodes_with_sliding_window_and_softcap_split_across_threads():
    check_against_reference(
        [(1, 2500), (1, 1300)],
        num_heads=6,
        num_kv_heads=2,
        head_size=80,
        block_size=32,
        sliding_window=700,
        softcap=3.0,
    )


def test_any_block_size_and_head_size_work():
    check_against_reference(MIXED, num_heads=4, num_kv_heads=2, head_size=72, block_size=5)


def test_more_than_sixteen_query_heads_per_kv_head():
    check_against_reference(MIXED, num_heads=40, num_kv_heads=2, head_size=32, block_size=16)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
def test_every_kernel_build_matches_reference(isa, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the run-time kernel choice
    check_against_reference(
        MIXED + [(1, 900)], num_heads=14, num_kv_heads=2, head_size=64, block_size=16, sliding_window=50, softcap=4.0
    )
    check_against_reference(MIXED, num_heads=3, num_kv_heads=3, head_size=128, block_size=8)


def test_empty_step_with_no_tokens_is_allowed():
    check_against_reference([(0, 5)], num_heads=4, num_kv_heads=2, head_size=64, block_size=16)


def test_blocks_outside_the_sliding_window_are_never_read():
    rng = np.random.default_rng(1)
    batch = make_batch(rng, [(1, 100)], num_heads=4, num_kv_heads=2, head_size=64, block_size=8)
    expected_batch = batch.copy()
    expected = reference(*vars(expected_batch).values(), num_heads=4, num_kv_heads=2, sliding_window=10)
    batch.block_tables[0, :11] = -1  # positions 0..87 are outside the window of position 99
    got = run_op(cached_session(4, 2, 64, sliding_window=10), batch)
    np.testing.assert_allclose(got, expected, atol=1e-4)


def test_the_op_works_at_one_thread():
    rng = np.random.default_rng(2)
    batch = make_batch(rng, MIXED, num_heads=6, num_kv_heads=2, head_size=64, block_size=16)
    expected = reference(*vars(batch.copy()).values(), num_heads=6, num_kv_heads=2)
    np.testing.assert_allclose(run_op(cached_session(6, 2, 64, threads=1), batch), expected, atol=1e-4)


@st.composite
def batches(draw):
    num_kv_heads = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 3, 7]))
    seq = st.tuples(st.integers(0, 40), st.integers(0, 90)).map(lambda qc: (min(qc), max(qc)))
    return dict(
        seqs=draw(st.lists(seq, min_size=1, max_size=5)),
        num_heads=num_kv_heads * group,
        num_kv_heads=num_kv_heads,
        head_size=draw(st.sampled_from([32, 64, 80, 128, 256])),
        block_size=draw(st.sampled_from([8, 16, 32])),
        sliding_window=draw(st.sampled_from([0, 0, 7, 33])),
        softcap=draw(st.sampled_from([0.0, 0.0, 5.0])),
        skip_fraction=draw(st.sampled_from([0.0, 0.2])),
        seed=draw(st.integers(0, 2**16)),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_random_batches_match_reference(case):
    check_against_reference(**case)
