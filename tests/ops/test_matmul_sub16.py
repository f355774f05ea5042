"""The sub16 ops, MatMulQ6K, MatMulQ3K and MatMulQ2K (x @ W.T for GGUF's Q6_K and Q3_K, w = d * sc * (q - middle):
6- or 3-bit codes, an int8 scale per 16 columns and a d per 256; and Q2_K, w = d * sc * q - dmin * mn: 2-bit codes, a
4-bit scale and min per 16 columns, a d and dmin per 256), match their numpy reference on every kernel build, with
int8 and 16-bit activations, fp16 and fp32 scales, on shapes a model gives them; the reference's layouts round-trip
and hold gguf's own dequantisation; GatherQ6K / Q3K / Q2K read the same rows; bad shapes name themselves."""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import gguf.quants
import numpy as np
import pytest
from onnx import TensorProto, helper
from ortserve.ops.matmul_q_reference import (
    dequantize_sub16,
    gather_sub16,
    matmul_sub16,
    pack_q2k,
    pack_sub16,
    unpack_sub16,
)
from paged_attention_harness import make_session, matmul_session, op_model

import ortserve.ops

ISAS = ["generic", "avx2", "avx512"]


@dataclass(frozen=True)
class Format:
    bits: int
    middle: int
    gguf_type: str
    block_bytes: int  # a GGUF block of 256 weights
    d_at: int  # where its fp16 d is
    width: int  # the op's block of 16 rows x 32 columns
    dmin_at: int | None = None  # where its fp16 dmin is (Q2_K: a min per 16 columns)

    @property
    def scale_dims(self) -> list:
        return ["G", "SB", 2, 16] if self.dmin_at is not None else ["G", "SB", 16]

    @property
    def op(self) -> str:
        return f"MatMulQ{self.bits}K"

    @property
    def qtype(self) -> gguf.GGMLQuantizationType:
        return gguf.GGMLQuantizationType[self.gguf_type]


Q6_K = Format(6, 32, "Q6_K", 210, 208, 416)
Q3_K = Format(3, 4, "Q3_K", 110, 108, 224)
Q2_K = Format(2, 0, "Q2_K", 84, 80, 160, dmin_at=82)
FORMATS = [pytest.param(Q6_K, id="Q6_K"), pytest.param(Q3_K, id="Q3_K"), pytest.param(Q2_K, id="Q2_K")]


def session(fmt: Format, n: int, scale_type: int = TensorProto.FLOAT16, bias: bool = False, activation_bits: int = 8):
    return matmul_session(fmt.op, n, fmt.scale_dims, scale_type, bias, activation_bits)


def pack(fmt, weight, scale_dtype=np.float16):
    """(codes, sc, d) or (Q2_K) (codes, sc, d, mn, dmin), in the op's layout."""
    if fmt is Q2_K:
        codes, sub, d, mins, dmin = weight
        return pack_q2k(codes, sub, mins, d, dmin, scale_dtype)
    return pack_sub16(*weight, fmt.bits, scale_dtype)


def random_weight(fmt, rng, n, k, dtype=np.float16):
    """(codes, sc, d), and for Q2_K mn and dmin, random in their ranges (sc: int8, or Q2_K's 0..15)."""
    codes = rng.integers(0, 1 << fmt.bits, (n, k), dtype=np.uint8)

    def scale(low, high):
        return rng.uniform(low, high, (n, -(-k // 256))).astype(dtype).astype(np.float32)

    if fmt is Q2_K:
        sub, mins = rng.integers(0, 16, (2, n, -(-k // 16)), dtype=np.uint8)
        return codes, sub, scale(1e-4, 2e-3), mins, scale(1e-4, 2e-3)
    return codes, rng.integers(-128, 128, (n, -(-k // 16)), dtype=np.int8), scale(1e-4, 2e-3)


def gguf_tensor(fmt, rng, n, k):
    """A Q6_K, Q3_K or Q2_K tensor [n, k] of random valid blocks (random code and sub-scale bytes, d (and dmin) of
    either sign in a sane range): its raw blocks, and their (codes, sub-block scales, d (, mins, dmin)), unpacked by
    gguf's own dequantiser: with d = 1 (and dmin = 0) it gives sc * (q - middle), and (Q3_K, whose 6-bit scales are
    packed) with every code 0 too, -4 * sc. Q2_K's sc and mn are the nibbles of its first 16 bytes."""
    blocks = rng.integers(0, 256, (n * k // 256, fmt.block_bytes), dtype=np.uint8)

    def half(at):
        values = rng.uniform(2e-5, 1e-4, len(blocks)) * rng.choice([-1, 1], len(blocks))
        blocks[:, at : at + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)
        return blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32).reshape(n, -1)

    d = half(fmt.d_at)
    dmin = half(fmt.dmin_at) if fmt is Q2_K else None
    raw = blocks.reshape(n, -1)
    unit = blocks.copy()
    unit[:, fmt.d_at : fmt.d_at + 2] = np.array([1.0], np.float16).view(np.uint8)
    if fmt is Q2_K:
        unit[:, fmt.dmin_at : fmt.dmin_at + 2] = 0
        sub, mins = blocks[:, :16].reshape(n, -1) & 15, blocks[:, :16].reshape(n, -1) >> 4
    elif fmt is Q6_K:
        sub = blocks[:, 192:208].view(np.int8).reshape(n, -1)
    else:
        lowest = unit.copy()
        lowest[:, :96] = 0  # high bits clear and low bits 0: q - 4 = -4 everywhere
        per_16 = gguf.quants.dequantize(lowest.reshape(n, -1), fmt.qtype).reshape(n, -1, 16)[..., 0]
        sub = (per_16 / -4).astype(np.int8)
    scaled = gguf.quants.dequantize(unit.reshape(n, -1), fmt.qtype).reshape(n, -1, 16)
    factor = sub.astype(np.float32)[..., None]
    codes = np.where(factor == 0, 0, scaled / np.where(factor == 0, 1, factor)) + fmt.middle
    weight = (codes.astype(np.uint8).reshape(n, k), sub, d)
    return raw, (*weight, mins, dmin) if fmt is Q2_K else weight


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_layout_round_trips(fmt):
    rng = np.random.default_rng(0)
    weight = random_weight(fmt, rng, 37, 600)
    packed, scales = pack(fmt, weight)
    assert packed.shape == (3, 19, fmt.width) and scales.shape == (3, 3, *fmt.scale_dims[2:])
    unpacked = unpack_sub16(packed, scales, 37, 600)
    assert len(unpacked) == len(weight)
    for got, want in zip(unpacked, weight):
        np.testing.assert_array_equal(got, want)


def test_the_6_bit_layout_is_the_5_bit_one_then_the_sixth_bits_then_the_sub_scales():
    codes = np.zeros((16, 32), np.uint8)
    codes[5, 9] = 39  # c = 2, j = 1, lane 21: nibble 7, fifth bit 0, sixth bit at byte 320 + 16 + 2, bit 5
    sub = np.zeros((16, 2), np.int8)
    sub[3, 1] = -7  # row 3, columns 16..31: byte 384 + 16 + 3
    packed, scales = pack_sub16(codes, sub, np.full((16, 1), 0.5, np.float32), 6)
    flat = packed[0, 0]
    assert flat[2 * 64 + 5 * 4 + 1] == 7 and flat[320 + 16 + 2] == 1 << 5 and flat[400 + 3] == 256 - 7
    assert np.count_nonzero(flat) == 3 and np.all(scales == 0.5)


def test_the_3_bit_layout_is_2_bit_fields_then_the_third_bits_then_the_sub_scales():
    codes = np.zeros((16, 32), np.uint8)
    codes[5, 9] = 6  # vector 2 (c = 0, p = 1), j = 1, lane 21: field 2 at bits 2-3 of byte 21, third bit: 146, bit 5
    codes[0, 31] = 3  # vector 7 (c = 1, p = 3), j = 3, lane 3: field 3 at bits 6-7 of byte 64 + 3, no third bit
    sub = np.zeros((16, 2), np.int8)
    sub[3, 1] = -7  # row 3, columns 16..31: byte 192 + 16 + 3
    packed, scales = pack_sub16(codes, sub, np.full((16, 1), 0.5, np.float32), 3)
    flat = packed[0, 0]
    assert flat[21] == 2 << 2 and flat[128 + 8 * 2 + 2] == 1 << 5 and flat[64 + 3] == 3 << 6 and flat[208 + 3] == 249
    assert np.count_nonzero(flat) == 4 and np.all(scales == 0.5)


def test_the_2_bit_layout_is_the_3_bit_ones_fields_then_sub_scales_and_mins_then_d_and_minus_dmin():
    codes = np.zeros((16, 32), np.uint8)
    codes[5, 9] = 2  # vector 2 (c = 0, p = 1), j = 1, lane 21: field 2 at bits 2-3 of byte 21
    sub, mins = np.zeros((2, 16, 2), np.uint8)
    sub[3, 1], mins[3, 1] = 7, 12  # row 3, columns 16..31: byte 128 + 16 + 3 = 7 | 12 << 4
    packed, scales = pack_q2k(codes, sub, mins, np.full((16, 1), 0.5, np.float32), np.full((16, 1), 0.25, np.float32))
    flat = packed[0, 0]
    assert flat[21] == 2 << 2 and flat[128 + 16 + 3] == 7 | 12 << 4 and np.count_nonzero(flat) == 2
    assert scales.shape == (1, 1, 2, 16) and np.all(scales[0, 0, 0] == 0.5) and np.all(scales[0, 0, 1] == -0.25)


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_reference_dequantises_as_gguf_does(fmt):
    """The layout holds a Q6_K, Q3_K or Q2_K tensor's codes and scales, and dequantize_sub16 gives gguf's weight bit
    for bit."""
    rng = np.random.default_rng(1)
    n, k = 20, 512
    raw, weight = gguf_tensor(fmt, rng, n, k)
    packed, scales = pack(fmt, weight)
    want = gguf.quants.dequantize(raw, fmt.qtype)
    assert np.array_equal(dequantize_sub16(packed, scales, n, k), want)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("rows", [1, 5, 19, 45])
@pytest.mark.parametrize("k,n", [(576, 96), (1536, 40), (64, 24), (40, 33)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_kernel_build_matches_the_reference(fmt, isa, activation_bits, scale_dtype, rows, k, n, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the build the op picks
    rng = np.random.default_rng([rows, k, n, activation_bits, ISAS.index(isa), scale_dtype == np.float16, fmt.bits])
    packed, scales = pack(fmt, random_weight(fmt, rng, n, k, scale_dtype), scale_dtype)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: no scale
    bias = rng.normal(size=n).astype(np.float32)
    scale_type = TensorProto.FLOAT16 if scale_dtype == np.float16 else TensorProto.FLOAT
    s = session(fmt, n, scale_type, bias=True, activation_bits=activation_bits)
    got = s.run(None, {"x": x, "codes": packed, "scales": scales, "bias": bias})[0]
    want = matmul_sub16(x, packed, scales, n, bias, activation_bits)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation_bits,bound", [(8, 1e-2), (16, 1e-4)])
@pytest.mark.parametrize("fmt", FORMATS)
def test_is_x_times_gguf_dequantised_weight_up_to_activation_rounding(fmt, isa, activation_bits, bound, monkeypatch):
    """An oracle independent of the reference's integer path: the float product with gguf's own
    dequantisation of a Q6_K, Q3_K or Q2_K tensor."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    rng = np.random.default_rng(7)
    n, k = 48, 768
    raw, weight = gguf_tensor(fmt, rng, n, k)
    packed, scales = pack(fmt, weight)
    x = rng.normal(size=(4, k)).astype(np.float32)
    got = session(fmt, n, activation_bits=activation_bits).run(None, {"x": x, "codes": packed, "scales": scales})[0]
    exact = x.astype(np.float64) @ gguf.quants.dequantize(raw, fmt.qtype).T.astype(np.float64)
    error = np.abs(got - exact).max() / np.abs(exact).max()
    assert bound / 10 < error < bound, error


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("top,sc", [(False, 127), (True, -128), (False, -128), (True, 127)])
@pytest.mark.parametrize("fmt", [pytest.param(Q6_K, id="Q6_K"), pytest.param(Q3_K, id="Q3_K")])
def test_the_largest_codes_scales_and_activations_do_not_overflow(fmt, isa, activation_bits, top, sc, monkeypatch):
    """Every code and sub-block scale at an end of its range against activations all +-127: the int16
    sums of the AVX2 kernel and the shifted residual sums are closest to their limits here."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    code = (1 << fmt.bits) - 1 if top else 0
    codes, sub = np.full((16, 512), code, np.uint8), np.full((16, 32), sc, np.int8)
    d = np.full((16, 2), 1 / 1024, np.float32)
    packed, scales = pack_sub16(codes, sub, d, fmt.bits)
    for sign in (1, -1):
        x = np.full((3, 512), sign * 2.0, np.float32)
        s = session(fmt, 16, activation_bits=activation_bits)
        got = s.run(None, {"x": x, "codes": packed, "scales": scales})[0]
        np.testing.assert_allclose(got, sign * 2.0 * 512 * sc * (code - fmt.middle) / 1024, rtol=1e-6)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("code,sc,mn", [(3, 15, 15), (0, 0, 15), (3, 15, 0), (3, 1, 15)])
def test_q2k_extremes_of_codes_scales_and_mins(isa, activation_bits, code, sc, mn, monkeypatch):
    """Q2_K's codes, 4-bit sub-scales and mins at the ends of their ranges against activations all +-127 (and, the
    last, a min's term 4 times the codes' and of the other sign): sum(x) * (d * sc * q - dmin * mn)."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    codes = np.full((16, 512), code, np.uint8)
    sub, mins = np.full((16, 32), sc, np.uint8), np.full((16, 32), mn, np.uint8)
    d, dmin = np.full((16, 2), 1 / 1024, np.float32), np.full((16, 2), 1 / 256, np.float32)
    packed, scales = pack_q2k(codes, sub, mins, d, dmin)
    for sign in (1, -1):
        x = np.full((3, 512), sign * 2.0, np.float32)
        got = session(Q2_K, 16, activation_bits=activation_bits).run(None, {"x": x, "codes": packed, "scales": scales})[
            0
        ]
        np.testing.assert_allclose(got, sign * 2.0 * 512 * (sc * code / 1024 - mn / 256), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("fmt", FORMATS)
def test_gather_reads_the_dequantised_rows(fmt, scale_dtype):
    """A Q6_K, Q3_K or Q2_K embedding's lookup (a tied one on the LM head's codes): bit for bit (d * sc) * (q - middle)
    (Q2_K: (d * sc) * q - dmin * mn)."""
    rng = np.random.default_rng(3)
    weight = random_weight(fmt, rng, 37, 600, scale_dtype)
    packed, scales = pack(fmt, weight, scale_dtype)
    ids = np.array([36, 0, 17, 17, 5], np.int64)
    scale_type = TensorProto.FLOAT16 if scale_dtype == np.float16 else TensorProto.FLOAT
    gather = fmt.op.replace("MatMul", "Gather")
    node = helper.make_node(gather, ["codes", "scales", "ids"], ["y"], domain=ortserve.ops.DOMAIN, N=37, K=600)
    graph = helper.make_graph(
        [node],
        "gather",
        [
            helper.make_tensor_value_info("codes", TensorProto.UINT8, ["G", "KB", fmt.width]),
            helper.make_tensor_value_info("scales", scale_type, fmt.scale_dims),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["T"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", 600])],
    )
    got = make_session(op_model(graph)).run(None, {"codes": packed, "scales": scales, "ids": ids})[0]
    want = gather_sub16(packed, scales, ids, 37, 600)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    codes, sub, d = weight[:3]
    columns = np.arange(600)
    step = d[ids][:, columns // 256] * sub[ids][:, columns // 16].astype(np.float32)
    expected = step * (codes[ids].astype(np.float32) - fmt.middle)
    if fmt is Q2_K:
        mins, dmin = weight[3:]
        expected = expected - dmin[ids][:, columns // 256] * mins[ids][:, columns // 16].astype(np.float32)
    assert np.array_equal(want, expected)


@pytest.mark.parametrize("fmt", FORMATS)
def test_scales_of_another_shape_are_rejected(fmt):
    """The sub16 ops' scales are one d per row and 256 columns: [G, ceil(KB / 8), 16] (Q2K: d and -dmin,
    [G, ceil(KB / 8), 2, 16])."""
    arrays = {
        "x": np.ones((1, 600), np.float32),
        "codes": np.zeros((2, 19, fmt.width), np.uint8),
        "scales": np.zeros((2, 19, *fmt.scale_dims[2:]), np.float16),
    }
    shape = ", ".join(map(str, [2, 3, *fmt.scale_dims[2:]]))
    wrong = ", ".join(map(str, [2, 19, *fmt.scale_dims[2:]]))
    with pytest.raises(Exception, match=rf"{fmt.op}: scales must be \[{shape}\], got \[{wrong}\]"):
        session(fmt, 20).run(None, arrays)


@pytest.mark.parametrize("fmt", FORMATS)
def test_codes_of_another_shape_are_rejected(fmt):
    arrays = {
        "x": np.ones((1, 600), np.float32),
        "codes": np.zeros((2, 19, 320), np.uint8),
        "scales": np.zeros((2, 3, *fmt.scale_dims[2:]), np.float16),
    }
    want = rf"codes must be \[ceil\(N / 16\), ceil\(K / 32\), {fmt.width}\] = \[2, 19, {fmt.width}\]"
    with pytest.raises(Exception, match=want):
        session(fmt, 20).run(None, arrays)
