"""MatMulQ4K / MatMulQ5K (x @ W.T for GGUF's Q4_K / Q5_K, w = d * sc * q - dmin * mn: 4- or 5-bit codes, a u8
sub-scale and min per row and 32 columns beside the codes, a d and dmin per row and 256 columns) match their
numpy reference on every kernel build, with int8 and 16-bit activations, fp16 and fp32 scales, on shapes a model
gives them; they answer bit for bit as MatMulQ4 / Q5 on the same weight with its d * sc and -dmin * mn stored in
fp32; the layout round-trips and holds gguf's own dequantisation; GatherQ4K / Q5K read the same rows; bad shapes
name themselves."""

from __future__ import annotations

import gguf
import gguf.quants
import numpy as np
import pytest
from onnx import TensorProto, helper
from ortserve.ops.matmul_q_reference import dequantize_q, gather_q, matmul_q, pack_q, pack_qk, unpack_q, unpack_qk
from paged_attention_harness import make_session, matmul_session, op_model

import ortserve.ops

ISAS = ["generic", "avx2", "avx512"]
FORMATS = {"Q4_K": 4, "Q5_K": 5}  # GGUF type -> the codes' width
BLOCK_BYTES = {"Q4_K": 144, "Q5_K": 176}  # a GGUF super-block of 256 weights


def session(
    bits: int, n: int, scale_type: int = TensorProto.FLOAT16, bias: bool = False, activation_bits: int = 8, op=""
):
    return matmul_session(op or f"MatMulQ{bits}K", n, ["G", "SB", 2, 16], scale_type, bias, activation_bits)


def random_weight(rng, n, k, bits, dtype=np.float16):
    codes = rng.integers(0, 1 << bits, (n, k), dtype=np.uint8)
    sub = rng.integers(0, 64, (n, -(-k // 32)), dtype=np.uint8)
    mins = rng.integers(0, 64, (n, -(-k // 32)), dtype=np.uint8)
    d = rng.uniform(1e-4, 1e-3, (n, -(-k // 256))).astype(dtype).astype(np.float32)
    dmin = rng.uniform(0, 1e-3, (n, -(-k // 256))).astype(dtype).astype(np.float32)
    return codes, sub, mins, d, dmin


def k_tensor(rng, qtype: str, n: int, k: int):
    """A Q4_K or Q5_K tensor [n, k] of random blocks (random code and scale bytes, d and dmin of either sign in a
    sane range): its raw blocks, and their codes, sub-scales, mins, d and dmin as gguf's own dequantiser reads
    them (with d = 1 and dmin = 0 it gives sc * q)."""
    blocks = rng.integers(0, 256, (n * k // 256, BLOCK_BYTES[qtype]), dtype=np.uint8)
    for at in (0, 2):
        values = rng.uniform(1e-4, 1e-3, len(blocks)) * rng.choice([-1, 1], len(blocks))
        blocks[:, at : at + 2] = values.astype(np.float16).view(np.uint8).reshape(-1, 2)
    d, dmin = (blocks[:, at : at + 2].copy().view(np.float16).astype(np.float32).reshape(n, -1) for at in (0, 2))
    sub, mins = gguf.quants.Q4_K.get_scale_min(blocks[:, 4:16])
    unit = blocks.copy()
    unit[:, 0:2] = np.array([1.0], np.float16).view(np.uint8)
    unit[:, 2:4] = 0
    scaled = gguf.quants.dequantize(unit.reshape(n, -1), gguf.GGMLQuantizationType[qtype]).reshape(n, -1, 32)
    factor = sub.reshape(n, -1).astype(np.float32)[..., None]
    codes = np.where(factor == 0, 0, scaled / np.where(factor == 0, 1, factor))
    return blocks.reshape(n, -1), codes.astype(np.uint8).reshape(n, k), sub.reshape(n, -1), mins.reshape(n, -1), d, dmin


@pytest.mark.parametrize("bits", [4, 5])
def test_the_layout_round_trips(bits):
    rng = np.random.default_rng(bits)
    fields = random_weight(rng, 37, 600, bits)
    packed, scales = pack_qk(*fields, bits=bits)
    assert packed.shape == (3, 19, 64 * bits + 32) and scales.shape == (3, 3, 2, 16)
    for got, want in zip(unpack_qk(packed, scales, 37, 600), fields):
        np.testing.assert_array_equal(got, want)


def test_the_layout_is_the_code_layout_then_the_sub_scales_then_the_mins():
    codes = np.zeros((16, 32), np.uint8)
    codes[5, 9] = 23  # c = 2, j = 1, lane 21: nibble 7, fifth bit at byte 256 + 16 + 2, bit 5
    sub, mins = np.zeros((16, 1), np.uint8), np.zeros((16, 1), np.uint8)
    sub[3, 0], mins[7, 0] = 63, 41  # bytes 320 + 3 and 320 + 16 + 7
    packed, scales = pack_qk(codes, sub, mins, np.full((16, 1), 0.5), np.full((16, 1), 0.25), bits=5)
    flat = packed[0, 0]
    assert flat[2 * 64 + 5 * 4 + 1] == 7 and flat[256 + 16 + 2] == 1 << 5
    assert flat[320 + 3] == 63 and flat[336 + 7] == 41 and np.count_nonzero(flat) == 4
    assert np.all(scales[0, 0, 0] == 0.5) and np.all(scales[0, 0, 1] == -0.25)


@pytest.mark.parametrize("qtype", FORMATS)
def test_the_reference_dequantises_as_gguf_does(qtype):
    """The layout holds a Q4_K / Q5_K tensor's codes, sub-scales and mins, and dequantize_q gives gguf's weight
    bit for bit: (d * sc) * q - dmin * mn, float32 products in gguf's order."""
    rng = np.random.default_rng(1)
    n, k = 20, 512
    raw, *fields = k_tensor(rng, qtype, n, k)
    packed, scales = pack_qk(*fields, bits=FORMATS[qtype])
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
    assert np.array_equal(dequantize_q(packed, scales, n, k), want)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", [4, 5])
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("rows", [1, 5, 19, 45])
@pytest.mark.parametrize("k,n", [(576, 96), (1536, 40), (40, 33)])
def test_every_kernel_build_matches_the_reference(isa, bits, activation_bits, scale_dtype, rows, k, n, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the build the op picks
    rng = np.random.default_rng([rows, k, n, bits, activation_bits, ISAS.index(isa), scale_dtype == np.float16])
    packed, scales = pack_qk(*random_weight(rng, n, k, bits, scale_dtype), bits=bits, scale_dtype=scale_dtype)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    x[0, :32] = 0.0  # a block of zeros: no scale
    bias = rng.normal(size=n).astype(np.float32)
    scale_type = TensorProto.FLOAT16 if scale_dtype == np.float16 else TensorProto.FLOAT
    s = session(bits, n, scale_type, bias=True, activation_bits=activation_bits)
    got = s.run(None, {"x": x, "codes": packed, "scales": scales, "bias": bias})[0]
    want = matmul_q(x, packed, scales, n, bias, activation_bits)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", [4, 5])
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("rows", [1, 19, 45])
def test_answers_bit_for_bit_as_the_same_weight_with_block_scales_in_fp32(
    isa, bits, activation_bits, rows, monkeypatch
):
    """MatMulQ4K forms each block's d * sc and -dmin * mn in the kernel, exactly, so it computes what MatMulQ4 /
    Q5 compute with those products stored in fp32 (the layout GGUF's K-quants were imported to before)."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    rng = np.random.default_rng([bits, activation_bits, rows, ISAS.index(isa)])
    n, k = 40, 1024
    packed, scales = pack_qk(*random_weight(rng, n, k, bits), bits=bits)
    codes, d, m = unpack_q(packed, scales, n, k)
    block_packed, block_scales = pack_q(codes, d, m, bits, np.float32)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    got = session(bits, n, activation_bits=activation_bits).run(None, {"x": x, "codes": packed, "scales": scales})[0]
    plain = session(bits, n, TensorProto.FLOAT, activation_bits=activation_bits, op=f"MatMulQ{bits}")
    want = plain.run(None, {"x": x, "codes": block_packed, "scales": block_scales})[0]
    assert np.array_equal(got, want)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("activation_bits,bound", [(8, 1e-2), (16, 1e-4)])
def test_is_x_times_gguf_dequantised_weight_up_to_activation_rounding(isa, qtype, activation_bits, bound, monkeypatch):
    """An oracle independent of the reference's integer path: the float product with gguf's own
    dequantisation of a Q4_K / Q5_K tensor."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    rng = np.random.default_rng(7)
    n, k = 48, 768
    raw, *fields = k_tensor(rng, qtype, n, k)
    packed, scales = pack_qk(*fields, bits=FORMATS[qtype])
    x = rng.normal(size=(4, k)).astype(np.float32)
    s = session(FORMATS[qtype], n, activation_bits=activation_bits)
    got = s.run(None, {"x": x, "codes": packed, "scales": scales})[0]
    weight = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])
    exact = x.astype(np.float64) @ weight.T.astype(np.float64)
    error = np.abs(got - exact).max() / np.abs(exact).max()
    assert bound / 10 < error < bound, error


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("bits", [4, 5])
@pytest.mark.parametrize("activation_bits", [8, 16])
def test_the_largest_codes_scales_and_activations_do_not_overflow(isa, bits, activation_bits, monkeypatch):
    """Every code, sub-scale and min at the top of its range against activations all +-127: the AVX2 kernel's
    int16 sums and the shifted residual sums are closest to their limits here."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    top = (1 << bits) - 1
    codes, sixty_three = np.full((16, 512), top, np.uint8), np.full((16, 16), 63, np.uint8)
    d, dmin = np.full((16, 2), 1 / 1024, np.float32), np.full((16, 2), 1 / 2048, np.float32)
    packed, scales = pack_qk(codes, sixty_three, sixty_three, d, dmin, bits=bits)
    for sign in (1, -1):
        x = np.full((3, 512), sign * 2.0, np.float32)
        got = session(bits, 16, activation_bits=activation_bits).run(None, {"x": x, "codes": packed, "scales": scales})[
            0
        ]
        np.testing.assert_allclose(got, sign * 2.0 * 512 * 63 * (top / 1024 - 1 / 2048), rtol=1e-6)


@pytest.mark.parametrize("qtype", FORMATS)
@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])
def test_gather_reads_gguf_dequantised_rows(qtype, scale_dtype):
    """An untied Q4_K embedding's lookup on its own codes: bit for bit gguf's rows."""
    rng = np.random.default_rng(3)
    n, k, bits = 37, 512, FORMATS[qtype]
    raw, *fields = k_tensor(rng, qtype, n, k)
    packed, scales = pack_qk(*fields, bits=bits, scale_dtype=scale_dtype)
    ids = np.array([36, 0, 17, 17, 5], np.int64)
    scale_type = TensorProto.FLOAT16 if scale_dtype == np.float16 else TensorProto.FLOAT
    node = helper.make_node(f"GatherQ{bits}K", ["codes", "scales", "ids"], ["y"], domain=ortserve.ops.DOMAIN, N=n, K=k)
    graph = helper.make_graph(
        [node],
        "gather",
        [
            helper.make_tensor_value_info("codes", TensorProto.UINT8, ["G", "KB", 64 * bits + 32]),
            helper.make_tensor_value_info("scales", scale_type, ["G", "SB", 2, 16]),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["T"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", k])],
    )
    got = make_session(op_model(graph)).run(None, {"codes": packed, "scales": scales, "ids": ids})[0]
    assert got.dtype == np.float32 and np.array_equal(got, gather_q(packed, scales, ids, n, k))
    assert np.array_equal(got, gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype])[ids])


def test_scales_of_another_shape_are_rejected():
    """Q4K's scales are a d and -dmin per row and 256 columns: [G, ceil(KB / 8), 2, 16]."""
    arrays = {
        "x": np.ones((1, 600), np.float32),
        "codes": np.zeros((2, 19, 288), np.uint8),
        "scales": np.zeros((2, 19, 2, 16), np.float16),
    }
    with pytest.raises(Exception, match=r"MatMulQ4K: scales must be \[2, 3, 2, 16\], got \[2, 19, 2, 16\]"):
        session(4, 20).run(None, arrays)


def test_codes_of_another_shape_are_rejected():
    arrays = {
        "x": np.ones((1, 600), np.float32),
        "codes": np.zeros((2, 19, 320), np.uint8),
        "scales": np.zeros((2, 3, 2, 16), np.float16),
    }
    with pytest.raises(Exception, match=r"codes must be \[ceil\(N / 16\), ceil\(K / 32\), 352\] = \[2, 19, 352\]"):
        session(5, 20).run(None, arrays)
