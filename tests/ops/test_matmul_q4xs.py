"""MatMulQ4XS (x @ W.T for GGUF's IQ4_XS, w = d * (ls - 32) * kvalue: 4-bit indices of IQ4's 16 values, an int8
sub-scale ls - 32 per row and 32 columns beside the indices, a d per row and 256 columns) matches its numpy reference
on every kernel build, with int8 and 16-bit activations, fp16 and fp32 d; it answers bit for bit as MatMulQ4NLS on the
same weight with each block's d * (ls - 32) stored in fp32 (IQ4_XS's layout before op_version 15); the layout
round-trips and holds gguf's own dequantisation; GatherQ4XS reads the same rows; bad shapes name themselves."""

from __future__ import annotations

import gguf
import gguf.quants
import numpy as np
import pytest
from onnx import TensorProto, helper
from ortserve.ops.matmul_q_reference import (
    Q4NL_CODES,
    dequantize_q,
    gather_q,
    matmul_q,
    pack_q,
    pack_q4xs,
    unpack_q,
    unpack_q4xs,
)
from paged_attention_harness import make_session, matmul_session, op_model

import ortserve.ops

ISAS = ["generic", "avx2", "avx512"]
IQ4_XS = gguf.GGMLQuantizationType.IQ4_XS
BLOCK_BYTES, CODES_AT = 136, 8  # a GGUF IQ4_XS block of 256 weights: d, the 6-bit ls (2 + 4 bytes), 128 of indices


def session(n: int, scale_type: int = TensorProto.FLOAT16, bias: bool = False, activation_bits: int = 8, op=""):
    return matmul_session(op or "MatMulQ4XS", n, ["G", "SB", 16], scale_type, bias, activation_bits)


def random_weight(rng, n, k, dtype=np.float16):
    indices = rng.integers(0, 16, (n, k), dtype=np.uint8)
    sub = rng.integers(-32, 32, (n, -(-k // 32)), dtype=np.int8)
    d = rng.uniform(1e-4, 1e-3, (n, -(-k // 256))).astype(dtype).astype(np.float32)
    return indices, sub, d


def xs_tensor(rng, n: int, k: int):
    """An IQ4_XS tensor [n, k] of random blocks (random index and scale bytes, d of either sign in a sane range): its
    raw blocks, and their indices, sub-scales ls - 32 and d as gguf's own dequantiser reads them: with d = 1 it gives
    (ls - 32) * kvalue, and with every index 8 too (kvalue 1), ls - 32."""
    blocks = rng.integers(0, 256, (n * k // 256, BLOCK_BYTES), dtype=np.uint8)
    values = rng.uniform(1e-4, 1e-3, len(blocks)) * rng.choice([-1, 1], len(blocks))
    blocks[:, 0:2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32).reshape(n, -1)
    unit = blocks.copy()
    unit[:, 0:2] = np.array([1.0], np.float16).view(np.uint8)
    ones = unit.copy()
    ones[:, CODES_AT:] = 0x88
    sub = gguf.quants.dequantize(ones.reshape(n, -1), IQ4_XS).reshape(n, -1, 32)[..., 0].astype(np.int8)
    scaled = gguf.quants.dequantize(unit.reshape(n, -1), IQ4_XS).reshape(n, -1, 32)
    factor = sub.astype(np.float32)[..., None]
    kvalues = np.where(factor == 0, 1, scaled / np.where(factor == 0, 1, factor)).astype(np.int16) + 128
    indices = np.searchsorted(Q4NL_CODES, kvalues).astype(np.uint8)
    assert np.array_equal(Q4NL_CODES[indices], kvalues)
    return blocks.reshape(n, -1), indices.reshape(n, k), sub, d


def test_the_layout_round_trips():
    rng = np.random.default_rng(0)
    fields = random_weight(rng, 37, 600)
    packed, scales = pack_q4xs(*fields)
    assert packed.shape == (3, 19, 272) and scales.shape == (3, 3, 16)
    for got, want in zip(unpack_q4xs(packed, scales, 37, 600), fields):
        np.testing.assert_array_equal(got, want)


def test_the_layout_is_the_4_bit_one_then_the_sub_scales():
    indices = np.zeros((16, 32), np.uint8)
    indices[5, 9] = 7  # c = 2, j = 1, lane 21: low nibble of byte 2 * 64 + 21
    sub = np.zeros((16, 1), np.int8)
    sub[3, 0] = -7  # byte 256 + 3
    packed, scales = pack_q4xs(indices, sub, np.full((16, 1), 0.5))
    flat = packed[0, 0]
    assert flat[2 * 64 + 5 * 4 + 1] == 7 and flat[256 + 3] == 256 - 7 and np.count_nonzero(flat) == 2
    assert np.all(scales == 0.5)


def test_the_reference_dequantises_as_gguf_does():
    """The layout holds an IQ4_XS tensor's indices, sub-scales and d, and dequantize_q gives gguf's weight bit for
    bit."""
    rng = np.random.default_rng(1)
    n, k = 20, 512
    raw, *fields = xs_tensor(rng, n, k)
    packed, scales = pack_q4xs(*fields)
    assert np.array_equal(dequantize_q(packed, scales, n, k), gguf.quants.dequantize(raw, IQ4_XS))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("rows", [1, 5, 19, 45])
@pytest.mark.parametrize("k,n", [(576, 96), (1536, 40), (40, 33)])
def test_every_kernel_build_matches_the_reference(isa, activation_bits, scale_dtype, rows, k, n, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the build the op picks
    rng = np.random.default_rng([rows, k, n, activation_bits, ISAS.index(isa), scale_dtype == np.float16])
    packed, scales = pack_q4xs(*random_weight(rng, n, k, scale_dtype), scale_dtype=scale_dtype)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: no scale
    bias = rng.normal(size=n).astype(np.float32)
    scale_type = TensorProto.FLOAT16 if scale_dtype == np.float16 else TensorProto.FLOAT
    s = session(n, scale_type, bias=True, activation_bits=activation_bits)
    got = s.run(None, {"x": x, "codes": packed, "scales": scales, "bias": bias})[0]
    want = matmul_q(x, packed, scales, n, bias, activation_bits)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("rows", [1, 19, 45])
def test_answers_bit_for_bit_as_the_same_weight_with_block_scales_in_fp32(isa, activation_bits, rows, monkeypatch):
    """MatMulQ4XS forms each block's d * (ls - 32) in the kernel, exactly, so it computes what MatMulQ4NLS computes
    with those products stored in fp32 (the layout IQ4_XS was imported to before)."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    rng = np.random.default_rng([activation_bits, rows, ISAS.index(isa)])
    n, k = 40, 1024
    indices, sub, d = random_weight(rng, n, k)
    packed, scales = pack_q4xs(indices, sub, d)
    block_d = d[:, np.arange(k // 32) // 8] * sub
    block_packed, block_scales = pack_q(indices, block_d, None, 4, np.float32)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    got = session(n, activation_bits=activation_bits).run(None, {"x": x, "codes": packed, "scales": scales})[0]
    plain = session(n, TensorProto.FLOAT, activation_bits=activation_bits, op="MatMulQ4NLS")
    want = plain.run(None, {"x": x, "codes": block_packed, "scales": block_scales})[0]
    assert np.array_equal(got, want)
    codes, block_d_read, _ = unpack_q(packed, scales, n, k)
    assert np.array_equal(block_d_read, block_d) and np.array_equal(codes, Q4NL_CODES[indices])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation_bits,bound", [(8, 1e-2), (16, 1e-4)])
def test_is_x_times_gguf_dequantised_weight_up_to_activation_rounding(isa, activation_bits, bound, monkeypatch):
    """An oracle independent of the reference's integer path: the float product with gguf's own
    dequantisation of an IQ4_XS tensor."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    rng = np.random.default_rng(7)
    n, k = 48, 768
    raw, *fields = xs_tensor(rng, n, k)
    packed, scales = pack_q4xs(*fields)
    x = rng.normal(size=(4, k)).astype(np.float32)
    got = session(n, activation_bits=activation_bits).run(None, {"x": x, "codes": packed, "scales": scales})[0]
    exact = x.astype(np.float64) @ gguf.quants.dequantize(raw, IQ4_XS).T.astype(np.float64)
    error = np.abs(got - exact).max() / np.abs(exact).max()
    assert bound / 10 < error < bound, error


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("index,sc", [(0, -32), (15, 31), (0, 31), (15, -32)])
def test_the_largest_codes_scales_and_activations_do_not_overflow(isa, activation_bits, index, sc, monkeypatch):
    """Every index and sub-scale at an end of its range against activations all +-127."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    indices, sub = np.full((16, 512), index, np.uint8), np.full((16, 16), sc, np.int8)
    packed, scales = pack_q4xs(indices, sub, np.full((16, 2), 1 / 1024, np.float32))
    kvalue = int(Q4NL_CODES[index]) - 128
    for sign in (1, -1):
        x = np.full((3, 512), sign * 2.0, np.float32)
        got = session(16, activation_bits=activation_bits).run(None, {"x": x, "codes": packed, "scales": scales})[0]
        np.testing.assert_allclose(got, sign * 2.0 * 512 * sc * kvalue / 1024, rtol=1e-6)


@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])
def test_gather_reads_gguf_dequantised_rows(scale_dtype):
    """An untied IQ4_XS embedding's lookup on its own codes: bit for bit gguf's rows."""
    rng = np.random.default_rng(3)
    n, k = 37, 512
    raw, *fields = xs_tensor(rng, n, k)
    packed, scales = pack_q4xs(*fields, scale_dtype=scale_dtype)
    ids = np.array([36, 0, 17, 17, 5], np.int64)
    scale_type = TensorProto.FLOAT16 if scale_dtype == np.float16 else TensorProto.FLOAT
    node = helper.make_node("GatherQ4XS", ["codes", "scales", "ids"], ["y"], domain=ortserve.ops.DOMAIN, N=n, K=k)
    graph = helper.make_graph(
        [node],
        "gather",
        [
            helper.make_tensor_value_info("codes", TensorProto.UINT8, ["G", "KB", 272]),
            helper.make_tensor_value_info("scales", scale_type, ["G", "SB", 16]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["T"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", k])],
    )
    got = make_session(op_model(graph)).run(None, {"codes": packed, "scales": scales, "ids": ids})[0]
    assert got.dtype == np.float32 and np.array_equal(got, gather_q(packed, scales, ids, n, k))
    assert np.array_equal(got, gguf.quants.dequantize(raw, IQ4_XS)[ids])


def test_scales_of_another_shape_are_rejected():
    """Q4XS's scales are a d per row and 256 columns: [G, ceil(KB / 8), 16]."""
    arrays = {
        "x": np.ones((1, 600), np.float32),
        "codes": np.zeros((2, 19, 272), np.uint8),
        "scales": np.zeros((2, 19, 16), np.float16),
    }
    with pytest.raises(Exception, match=r"MatMulQ4XS: scales must be \[2, 3, 16\], got \[2, 19, 16\]"):
        session(20).run(None, arrays)


def test_codes_of_another_shape_are_rejected():
    arrays = {
        "x": np.ones((1, 600), np.float32),
        "codes": np.zeros((2, 19, 256), np.uint8),
        "scales": np.zeros((2, 3, 16), np.float16),
    }
    with pytest.raises(Exception, match=r"codes must be \[ceil\(N / 16\), ceil\(K / 32\), 272\] = \[2, 19, 272\]"):
        session(20).run(None, arrays)
