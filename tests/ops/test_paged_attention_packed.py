"""PackedPagedAttention (packed qkv; q/k norm and rotary inside the op) matches its numpy reference,
paged_attention_packed(), on every batch shape and option; bad inputs name themselves."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from ortserve.ops.paged_attention_reference import decode_rows, encode_rows
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
    cache_dtype=np.float32,
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
        key_cache=encode_rows(b.key_cache, cache_dtype),
        value_cache=encode_rows(b.value_cache, cache_dtype),
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


def check(seqs, *, num_heads=6, num_kv_heads=2, head_size=64, seed=0, attrs=None, exact_caches=False, **options):
    """The op against the reference; the caches must hold the same rows (bit for bit with
    ``exact_caches``, else up to the last rounding: a norm's sum order differs from numpy's)."""
    rng = np.random.default_rng(seed)
    arrays, optional = packed_inputs(
        rng, seqs, num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size, **options
    )
    attrs = attrs or {}
    cache_dtype = arrays["key_cache"].dtype
    expected_caches = {k: arrays[k].copy() for k in ("key_cache", "value_cache")}
    expected = reference(**{**arrays, **expected_caches}, num_heads=num_heads, num_kv_heads=num_kv_heads, **attrs)
    model = build_packed_model(
        num_heads, num_kv_heads, head_size, optional_inputs=optional, cache_dtype=cache_dtype, **attrs
    )
    got = run_packed(make_session(model), arrays)
    err = np.abs(got - expected).max(initial=0.0)
    assert err <= 1e-4 * max(np.abs(expected).max(initial=0.0), 1e-6), f"max abs error {err}"
    for name, cache in expected_caches.items():  # rotated, normed keys and the values, at their slots
        if exact_caches:
            np.testing.assert_array_equal(arrays[name], cache)
        else:
            step = {np.float32: 1e-6, np.float16: 1e-3, np.int8: 1.5 / 127}[cache_dtype.type]
            np.testing.assert_allclose(
                decode_rows(arrays[name], head_size), decode_rows(cache, head_size), rtol=step, atol=step * 4
            )


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


CACHE_DTYPES = [np.float32, np.float16, np.int8]


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=["fp32", "fp16", "int8"])
@pytest.mark.parametrize("seqs", [PREFILL, DECODE, MIXED], ids=["prefill", "decode", "mixed"])
def test_every_cache_dtype_holds_exactly_the_reference_rows(cache_dtype, seqs):
    check(seqs, cache_dtype=cache_dtype, skip_fraction=0.2, exact_caches=True)


@pytest.mark.parametrize("cache_dtype", CACHE_DTYPES, ids=["fp32", "fp16", "int8"])
def test_rotary_and_norms_over_a_compact_cache_match_reference(cache_dtype):
    check(MIXED, cache_dtype=cache_dtype, rotary_dim=64, norms=True, head_size=128)


@pytest.mark.parametrize("cache_dtype", [np.float16, np.int8], ids=["fp16", "int8"])
def test_long_decodes_over_a_compact_cache_split_across_threads(cache_dtype):
    check([(1, 900), (1, 300)], cache_dtype=cache_dtype, rotary_dim=64, max_positions=1024)


@pytest.mark.parametrize("head_size", [32, 80, 96, 40])
def test_compact_caches_work_for_head_sizes_that_are_not_multiples_of_the_vector(head_size):
    for cache_dtype in (np.float16, np.int8):
        check(MIXED, head_size=head_size, cache_dtype=cache_dtype, exact_caches=True)


def test_half_rounding_matches_numpy_at_the_edges():
    """Ties to even, the largest half, overflow to infinity, subnormals and zeros: the op's
    float -> half conversion is numpy's, bit for bit."""
    rng = np.random.default_rng(5)
    arrays, optional = packed_inputs(rng, [(4, 4)], num_heads=2, num_kv_heads=2, head_size=32, cache_dtype=np.float16)
    edges = np.array(
        [
            65504,
            65519,
            65520,
            70000,
            1e-8,
            6e-8,
            2.98e-8,
            3e-5,
            6.1e-5,
            0.0,
            -0.0,
            1 + 2**-11,
            1 + 3 * 2**-11,
            -(1 + 2**-11),
            2049,
            2051,
            0.1,
            -0.3,
            1e-4,
            5.96e-8,
        ],
        np.float32,
    )
    k = arrays["qkv"][:, 2 * 32 : 4 * 32]
    k[...] = np.resize(edges, k.shape)
    expected = arrays["key_cache"].copy()
    slots = arrays["slot_mapping"]
    for t, slot in enumerate(slots):
        expected[slot // 16, :, slot % 16] = k[t].reshape(2, 32).astype(np.float16)
    session = make_session(build_packed_model(2, 2, 32, optional_inputs=optional, cache_dtype=np.float16))
    with np.errstate(all="ignore"):
        run_packed(session, arrays)
    np.testing.assert_array_equal(arrays["key_cache"].view(np.uint16), expected.view(np.uint16))


def test_an_all_zero_row_gets_a_zero_scale_in_an_int8_cache():
    arrays, optional = packed_inputs(
        np.random.default_rng(6), [(3, 3)], num_heads=2, num_kv_heads=2, head_size=32, cache_dtype=np.int8
    )
    arrays["qkv"][:, 64:128] = 0.0  # the keys
    session = make_session(build_packed_model(2, 2, 32, optional_inputs=optional, cache_dtype=np.int8))
    run_packed(session, arrays)
    rows = arrays["key_cache"][arrays["slot_mapping"] // 16, :, arrays["slot_mapping"] % 16]
    assert not rows.any()  # codes 0 and a 0.0 scale


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_every_kernel_build_reads_compact_caches(isa, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the build the op picks
    for cache_dtype in (np.float16, np.int8):
        check(MIXED, head_size=80, cache_dtype=cache_dtype, rotary_dim=80, exact_caches=True)
