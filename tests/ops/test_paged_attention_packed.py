"""PackedPagedAttention (packed qkv; q/k norm and rotary inside the op) matches its numpy reference,
paged_attention_packed(), on every batch shape and option; bad inputs name themselves."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from ortserve.ops.paged_attention_reference import paged_attention_packed as reference
from paged_attention_harness import build_packed_model, cached_session, make_batch, make_session, run_op, run_packed

OPTIONAL = ("positions", "cos_cache", "sin_cache", "q_norm", "k_norm")
PREFILL, DECODE, MIXED = [(37, 37)], [(1, 1), (1, 40), (1, 17)], [(1, 30), (12, 12), (1, 1), (9, 70), (1, 33)]


def packed_inputs(
    rng,
    seqs,
    *,
    num_heads,
    num_kv_heads,
    head_size,
    block_size=16,
    rotary_dim=None,
    norms=False,
    skip_fraction=0.0,
    max_positions=128,
):
    """A random batch for PackedPagedAttention: a PagedAttention batch's q, k, v packed, plus rotary tables of
    ``rotary_dim`` (None = no rotary) and random norm weights when ``norms``."""
    b = make_batch(
        rng,
        seqs,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_size=head_size,
        block_size=block_size,
        skip_fraction=skip_fraction,
    )
    arrays = dict(
        qkv=np.concatenate([b.query, b.key, b.value], axis=1),
        key_cache=b.key_cache,
        value_cache=b.value_cache,
        slot_mapping=b.slot_mapping,
        block_tables=b.block_tables,
        context_lens=b.context_lens,
        query_start_loc=b.query_start_loc,
    )
    optional = []
    if rotary_dim or norms:
        positions = np.concatenate([np.arange(ctx - q, ctx) for q, ctx in seqs]).astype(np.int64)
        arrays["positions"] = positions
        optional.append("positions")
    if rotary_dim:
        angles = np.arange(max_positions)[:, None] * (10000.0 ** (-np.arange(rotary_dim // 2) / (rotary_dim // 2)))
        arrays["cos_cache"], arrays["sin_cache"] = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        optional += ["cos_cache", "sin_cache"]
    if norms:
        if not rotary_dim:  # positional: norms come after the tables; identity rotation
            arrays["cos_cache"] = np.ones((max_positions, 1), np.float32)
            arrays["sin_cache"] = np.zeros((max_positions, 1), np.float32)
            optional += ["cos_cache", "sin_cache"]
        arrays["q_norm"] = rng.uniform(0.5, 1.5, head_size).astype(np.float32)
        arrays["k_norm"] = rng.uniform(0.5, 1.5, head_size).astype(np.float32)
        optional += ["q_norm", "k_norm"]
    return arrays, tuple(optional)


def check(seqs, *, num_heads=6, num_kv_heads=2, head_size=64, seed=0, attrs=None, **options):
    rng = np.random.default_rng(seed)
    arrays, optional = packed_inputs(
        rng, seqs, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size, **options
    )
    attrs = attrs or {}
    expected_caches = {k: arrays[k].copy() for k in ("key_cache", "value_cache")}
    expected = reference(**{**arrays, **expected_caches}, num_heads=num_heads, num_kv_heads=num_kv_heads, **attrs)
    session = make_session(build_packed_model(num_heads, num_kv_heads, head_size, optional_inputs=optional, **attrs))
    got = run_packed(session, arrays)
    err = np.abs(got - expected).max(initial=0.0)
    assert err <= 1e-4 * max(np.abs(expected).max(initial=0.0), 1e-6), f"max abs error {err}"
    for name, cache in expected_caches.items():  # rotated, normed keys and the values, at their slots
        np.testing.assert_allclose(arrays[name], cache, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("seqs", [PREFILL, DECODE, MIXED], ids=["prefill", "decode", "mixed"])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (6, 2), (9, 3)])
def test_rotary_inside_the_op_matches_reference(seqs, num_heads, num_kv_heads):
    check(seqs, num_heads=num_heads, num_kv_heads=num_kv_heads, rotary_dim=64)


@pytest.mark.parametrize("seqs", [PREFILL, MIXED], ids=["prefill", "mixed"])
def test_q_and_k_norm_then_rotary_match_reference(seqs):
    check(seqs, rotary_dim=64, norms=True, head_size=128)


def test_partial_rotary_leaves_the_rest_of_each_head_alone():
    check(MIXED, rotary_dim=32, head_size=96)


def test_norms_without_rotary_match_reference():
    check(MIXED, norms=True)


def test_no_rotary_at_all_is_paged_attention_on_packed_input():
    check(MIXED)


def test_skipped_slots_and_sliding_window_and_softcap():
    check(MIXED, rotary_dim=64, skip_fraction=0.3, attrs=dict(sliding_window=8, softcap=30.0, scale=0.1))


def test_a_long_prefill_is_prepared_on_many_threads_and_still_exact():
    check([(300, 300), (1, 50)], rotary_dim=64, norms=True, max_positions=512)


def test_paged_attention_graphs_still_run_beside_the_packed_op():
    rng = np.random.default_rng(3)
    batch = make_batch(rng, MIXED, num_heads=6, num_kv_heads=2, head_size=64, block_size=16)
    assert run_op(cached_session(6, 2, 64), batch).shape == (sum(q for q, _ in MIXED), 6 * 64)


def error_of(arrays, optional, **model):
    session = make_session(build_packed_model(6, 2, 64, optional_inputs=optional, **model))
    with pytest.raises(Exception) as info:
        run_packed(session, arrays)
    return str(info.value)


@pytest.fixture
def good():
    return packed_inputs(np.random.default_rng(1), MIXED, num_heads=6, num_kv_heads=2, head_size=64, rotary_dim=64)


def test_qkv_width_that_is_not_heads_times_head_size_is_rejected(good):
    arrays, optional = good
    arrays["qkv"] = arrays["qkv"][:, :-1]
    model = build_packed_model(6, 2, 64, optional_inputs=optional)
    model.graph.input[0].CopyFrom(helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["T", "width"]))
    with pytest.raises(Exception, match=r"qkv must be \[T, \(num_heads \+ 2\*num_kv_heads\)\*head_size\]"):
        run_packed(make_session(model), arrays)


def test_position_outside_the_rotary_tables_is_rejected(good):
    arrays, optional = good
    arrays["positions"][2] = 128
    assert "positions[2] = 128 is outside the rotary tables (max_positions = 128)" in error_of(arrays, optional)


def test_rotary_tables_wider_than_the_head_are_rejected(good):
    arrays, optional = good
    arrays["cos_cache"] = np.ones((128, 40), np.float32)
    arrays["sin_cache"] = np.zeros((128, 40), np.float32)
    assert "rotary_dim <= head_size 64" in error_of(arrays, optional)


def test_norm_weight_of_the_wrong_size_is_rejected(good):
    arrays, optional = good
    arrays["q_norm"] = np.ones(63, np.float32)
    model = build_packed_model(6, 2, 64, optional_inputs=(*optional, "q_norm"))
    model.graph.input[-1].CopyFrom(helper.make_tensor_value_info("q_norm", TensorProto.FLOAT, ["n"]))
    with pytest.raises(Exception, match=r"q_norm must be \[head_size\] = \[64\], got \[63\]"):
        run_packed(make_session(model), arrays)


def test_rejected_input_leaves_the_cache_untouched(good):
    arrays, optional = good
    before = arrays["key_cache"].copy()
    arrays["positions"][0] = -1
    assert "positions[0] = -1" in error_of(arrays, optional)
    np.testing.assert_array_equal(arrays["key_cache"], before)
