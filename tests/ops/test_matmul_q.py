"""MatMulQ4 / Q5 / Q8 / Q4NL (x @ W.T for 4-, 5- or 8-bit block-quantised W, or 4-bit indices of 8-bit
codes; int8 or int8 + residual activations) and their centred forms MatMulQ4S / Q5S / Q8S / Q4NLS (m = -middle * d,
not stored) match their numpy reference on every shape a model gives them (rows not a multiple of 16, columns not a
multiple of 32, one row or a prefill chunk), with fp16 or fp32 scales, with and without bias, on every kernel build;
the centred ones answer bit for bit as the uncentred ones holding that m; GatherQ4 / Q5 / Q8 / Q4NL (and centred)
read the same rows; the layout round-trips; bad input names itself."""

from __future__ import annotations

from dataclasses import dataclass

import gguf.quants
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from ortserve.ops.matmul_q_reference import (
    Q4NL_CODES,
    dequantize_q,
    gather_q,
    matmul_q,
    pack_q,
    quantize_activations,
    unpack_q,
)
from paged_attention_harness import make_session, op_model

import ortserve.ops


@dataclass(frozen=True)
class QFormat:
    suffix: str  # of the op's name: MatMulQ{suffix}
    bits: int  # the stored codes' width (pack_q's bits)
    nonlinear: bool = False  # Q4NL: the codes index Q4NL_CODES
    centred: bool = False  # m = -middle * d, not stored: scales [G, KB, 16]

    @property
    def largest(self) -> int:
        """The largest value a code stands for."""
        return int(Q4NL_CODES[-1]) if self.nonlinear else (1 << self.bits) - 1

    @property
    def middle(self) -> int:
        """A centred weight's zero point: m = -middle * d."""
        return 128 if self.nonlinear else 1 << (self.bits - 1)

    @property
    def scale_dims(self) -> list:
        return ["G", "KB", 16] if self.centred else ["G", "KB", 2, 16]

    def weight(self, rng, n, k, dtype=np.float16):
        """Random (codes, d, m) of this format (centred: m = -middle * d)."""
        codes, d, m = random_weight(rng, n, k, dtype, self.bits)
        return codes, d, (-self.middle * d).astype(np.float32) if self.centred else m

    def pack(self, codes, d, m, dtype=np.float16):
        return pack_q(codes, d, None if self.centred else m, self.bits, dtype)

    def __str__(self) -> str:
        return f"Q{self.suffix}"


Q4, Q5, Q8, Q4NL = QFormat("4", 4), QFormat("5", 5), QFormat("8", 8), QFormat("4NL", 4, nonlinear=True)
CENTRED = [QFormat(f"{f.suffix}S", f.bits, f.nonlinear, centred=True) for f in (Q4, Q5, Q8, Q4NL)]
FORMATS = [Q4, Q5, Q8, Q4NL, *CENTRED]


def session(
    n: int | None,
    scale_type: int = TensorProto.FLOAT16,
    bias: bool = False,
    activation_bits: int | None = None,
    fmt: QFormat = Q4,
) -> ort.InferenceSession:
    attrs = {} if n is None else {"N": n}
    if activation_bits is not None:
        attrs["activation_bits"] = activation_bits
    inputs = ["x", "codes", "scales"] + (["bias"] if bias else [])
    node = helper.make_node(f"MatMulQ{fmt.suffix}", inputs, ["y"], domain=ortserve.ops.DOMAIN, **attrs)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "q4",
        [
            helper.make_tensor_value_info("x", f, ["T", "K"]),
            helper.make_tensor_value_info("codes", TensorProto.UINT8, ["G", "KB", 64 * fmt.bits]),
            helper.make_tensor_value_info("scales", scale_type, fmt.scale_dims),
            *([helper.make_tensor_value_info("bias", f, ["N"])] if bias else []),
        ],
        [helper.make_tensor_value_info("y", f, ["T", "N"])],
    )
    return make_session(op_model(graph))


def random_weight(rng, n, k, dtype=np.float16, bits=4):
    codes = rng.integers(0, 1 << bits, (n, k), dtype=np.uint8)
    k_blocks = -(-k // 32)
    d = rng.uniform(0.001, 0.02, (n, k_blocks)).astype(dtype).astype(np.float32)
    m = rng.uniform(-0.15, 0.0, (n, k_blocks)).astype(dtype).astype(np.float32)
    return codes, d, m


def test_the_4nl_codes_are_gguf_iq4_values_plus_128():
    np.testing.assert_array_equal(Q4NL_CODES.astype(np.int32) - 128, gguf.quants.IQ4_NL.kvalues)


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_the_layout_round_trips(bits):
    rng = np.random.default_rng(0)
    codes, d, m = random_weight(rng, 37, 70, bits=bits)
    packed, scales = pack_q(codes, d, m, bits)
    assert packed.shape == (3, 3, 64 * bits) and scales.shape == (3, 3, 2, 16)
    got_codes, got_d, got_m = unpack_q(packed, scales, 37, 70)
    np.testing.assert_array_equal(got_codes, codes)
    np.testing.assert_array_equal(got_d, d)
    np.testing.assert_array_equal(got_m, m)


def test_the_layout_puts_16_rows_by_4_columns_in_64_bytes():
    """Byte c * 64 + r * 4 + j of block 0: q[r, 4c + j] low, q[r, 16 + 4c + j] high."""
    codes = np.zeros((16, 32), np.uint8)
    codes[5, 9] = 7  # c = 2, j = 1, low
    codes[3, 16 + 12 + 2] = 11  # c = 3, j = 2, high
    packed, _ = pack_q(codes, np.ones((16, 1)), np.zeros((16, 1)))
    flat = packed[0, 0]
    assert flat[2 * 64 + 5 * 4 + 1] == 7
    assert flat[3 * 64 + 3 * 4 + 2] == 11 << 4
    assert np.count_nonzero(flat) == 2


def test_the_5_bit_layout_is_the_4_bit_one_then_a_bit_plane():
    """The low nibbles as 4-bit codes; bit 4 of q[r, 4c + j] at bit i % 8 of byte 256 + 8c + i / 8, i = 4r + j."""
    codes = np.zeros((16, 32), np.uint8)
    codes[5, 9] = 23  # c = 2, j = 1, lane 21: nibble 7, fifth bit at byte 256 + 16 + 2, bit 5
    codes[3, 30] = 16  # c = 7 (16 + 4 * 3 + 2), lane 14: nibble 0, fifth bit at byte 256 + 56 + 1, bit 6
    packed, _ = pack_q(codes, np.ones((16, 1)), np.zeros((16, 1)), 5)
    flat = packed[0, 0]
    assert flat.shape == (320,) and flat[2 * 64 + 5 * 4 + 1] == 7
    assert flat[256 + 16 + 2] == 1 << 5 and flat[256 + 56 + 1] == 1 << 6
    assert np.count_nonzero(flat) == 3


def test_the_8_bit_layout_puts_16_rows_by_4_columns_in_64_bytes():
    """Byte c * 64 + r * 4 + j of block 0: q[r, 4c + j], for c < 8."""
    codes = np.zeros((16, 32), np.uint8)
    codes[5, 9] = 200  # c = 2, j = 1
    codes[3, 30] = 17  # c = 7, j = 2
    packed, _ = pack_q(codes, np.ones((16, 1)), np.zeros((16, 1)), 8)
    flat = packed[0, 0]
    assert flat[2 * 64 + 5 * 4 + 1] == 200 and flat[7 * 64 + 3 * 4 + 2] == 17
    assert np.count_nonzero(flat) == 2


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("rows", [1, 3, 8, 13, 70])
@pytest.mark.parametrize("k,n", [(576, 960), (1536, 576), (64, 24), (40, 33)])
def test_matches_the_numpy_reference(rows, k, n, scale_dtype, activation_bits, fmt):
    rng = np.random.default_rng(rows * 1000 + k + n)
    packed, scales = fmt.pack(*fmt.weight(rng, n, k, scale_dtype), scale_dtype)
    x = rng.normal(0.0, 1.0, (rows, k)).astype(np.float32)
    scale_type = TensorProto.FLOAT16 if scale_dtype == np.float16 else TensorProto.FLOAT
    s = session(n, scale_type, activation_bits=activation_bits, fmt=fmt)
    got = s.run(None, {"x": x, "codes": packed, "scales": scales})
    want = matmul_q(x, packed, scales, n, activation_bits=activation_bits, nonlinear=fmt.nonlinear)
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("fmt", [Q4, Q8, Q4NL, CENTRED[2]], ids=str)
def test_initializer_weights_are_the_ops_own_copy(fmt, tmp_path):
    """Weights stored as initializers in a data file, as in an artifact: onnxruntime maps the file
    (4 KiB pages), and the op copies them once at load into memory the engine puts on huge pages. So
    the answer matches the reference, and stays the same when the file changes under the session."""
    import onnx

    rng = np.random.default_rng(FORMATS.index(fmt))
    n, k = 48, 96
    packed, scales = fmt.pack(*fmt.weight(rng, n, k))
    node = helper.make_node(f"MatMulQ{fmt.suffix}", ["x", "codes", "scales"], ["y"], domain=ortserve.ops.DOMAIN, N=n)
    graph = helper.make_graph(
        [node],
        "initializers",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", n])],
        [onnx.numpy_helper.from_array(packed, "codes"), onnx.numpy_helper.from_array(scales, "scales")],
    )
    path = tmp_path / "model.onnx"
    onnx.save_model(op_model(graph), path, save_as_external_data=True, location="model.onnx.data", size_threshold=0)
    options = ort.SessionOptions()
    ortserve.ops.register(options)
    s = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    x = rng.normal(0.0, 1.0, (3, k)).astype(np.float32)
    want = matmul_q(x, packed, scales, n, activation_bits=8, nonlinear=fmt.nonlinear)
    np.testing.assert_allclose(s.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    data = tmp_path / "model.onnx.data"
    with data.open("r+b") as f:  # in place: a private mapping of the file sees these bytes
        f.write(bytes(data.stat().st_size))
    np.testing.assert_allclose(s.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("activation_bits,bound", [(8, 1e-2), (16, 1e-4)])
def test_is_x_times_the_dequantised_weight_up_to_activation_rounding(activation_bits, bound, fmt):
    """An oracle independent of the reference's integer path: the float product with d * q + m. The
    residual pass takes the error from about 0.5 % to about 0.002 %."""
    rng = np.random.default_rng(7)
    codes, d, m = fmt.weight(rng, 96, 576)
    d = (d * 15 / fmt.largest).astype(np.float16).astype(np.float32)  # the same weight range as 4-bit codes
    packed, scales = fmt.pack(codes, d, -fmt.middle * d if fmt.centred else m)
    x = rng.normal(0.0, 1.0, (4, 576)).astype(np.float32)
    s = session(96, activation_bits=activation_bits, fmt=fmt)
    got = s.run(None, {"x": x, "codes": packed, "scales": scales})[0]
    exact = x.astype(np.float64) @ dequantize_q(packed, scales, 96, 576, fmt.nonlinear).T.astype(np.float64)
    error = np.abs(got - exact).max() / np.abs(exact).max()
    assert bound / 10 < error < bound, error


def test_adds_the_bias():
    rng = np.random.default_rng(1)
    codes, d, m = random_weight(rng, 20, 64)
    packed, scales = pack_q(codes, d, m)
    x, bias = rng.normal(size=(2, 64)).astype(np.float32), rng.normal(size=20).astype(np.float32)
    got = session(20, bias=True).run(None, {"x": x, "codes": packed, "scales": scales, "bias": bias})[0]
    np.testing.assert_allclose(got, matmul_q(x, packed, scales, 20, bias), rtol=1e-5, atol=1e-5)


def test_activations_round_to_nearest_even_with_the_block_maximum_at_127():
    x = np.zeros((1, 32), np.float32)
    x[0, :4] = [7.9375, 0.03125, -0.09375, 0.15625]  # x * 127 / 7.9375 = x * 16: 127, 0.5, -1.5, 2.5
    xq, dx, sx = quantize_activations(x)
    assert xq[0, :4].tolist() == [127, 0, -2, 2]
    assert dx[0, 0] == 0.0625 and sx[0, 0] == 0.0625 * 127


def test_the_residual_rounds_on_a_grid_256_times_finer_clipped_to_127():
    x = np.zeros((1, 32), np.float32)
    x[0, :5] = [7.9375, 0.03125, -0.09375, 0.1, -0.01]  # dx = 0.0625: codes 127, 0, -2, 2, 0
    xq, dx, sx = quantize_activations(x, residual=True)
    assert xq[0, :5].tolist() == [127, 0, -2, 2, 0]
    # residuals 0, 0.03125, 0.03125, 0.1 - 0.125, -0.01, times 16 * 256: 0, 128 (-> 127), 128, -102.4, -40.96
    assert xq[1, :5].tolist() == [0, 127, 127, -102, -41]
    assert dx[1, 0] == 0.0625 / 256 and sx[1, 0] == np.float32(0.0625 / 256 * (127 + 127 - 102 - 41))


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("fmt", [Q4, Q5, Q8], ids=str)
@pytest.mark.parametrize("rows", [1, 6])
def test_16_bit_activations_are_the_reference_codes(isa, fmt, rows, monkeypatch):
    """Unit weights on the diagonal: output r is x[:, r] as the kernel rounded it, dx * xq + dx / 256 * xq',
    which must be the reference's to the last bit of the product (whatever order the kernel adds in)."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    codes = np.eye(64, dtype=np.uint8)
    d, m = np.ones((64, 2), np.float32), np.zeros((64, 2), np.float32)
    packed, scales = pack_q(codes, d, m, fmt.bits)
    x = np.random.default_rng(rows).normal(size=(rows, 64)).astype(np.float32)
    got = session(64, activation_bits=16, fmt=fmt).run(None, {"x": x, "codes": packed, "scales": scales})[0]
    xq, dx, _ = quantize_activations(x, residual=True)
    scale = np.repeat(dx.astype(np.float64), 32, axis=1)
    held = (xq * scale).reshape(rows, 2, 64).sum(axis=1)
    np.testing.assert_allclose(got, held, rtol=2e-7, atol=0)
    # within half a step of the fine grid, or one step where the residual's code is clipped at +-127
    fine = np.repeat(dx[1::2].astype(np.float64), 32, axis=1)
    steps = np.where(np.abs(xq[1::2]) == 127, 1.0, 0.5) * 1.001
    assert np.abs(held - x).max() > 0 and np.all(np.abs(held - x) <= fine * steps)


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
@pytest.mark.parametrize("sign", [1, -1])
def test_the_largest_codes_and_activations_do_not_saturate(isa, fmt, sign, monkeypatch):
    """Every code at its maximum against activations all +-127: the int16 pair sums of the AVX2 kernels
    are closest to their limit here."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    codes = np.full((16, 64), (1 << fmt.bits) - 1, np.uint8)
    d, m = np.full((16, 2), 1 / 64, np.float32), np.zeros((16, 2), np.float32)  # exact in fp16
    packed, scales = fmt.pack(codes, d, m)
    x = np.full((3, 64), sign * 2.0, np.float32)
    got = session(16, fmt=fmt).run(None, {"x": x, "codes": packed, "scales": scales})[0]
    np.testing.assert_allclose(got, matmul_q(x, packed, scales, 16, nonlinear=fmt.nonlinear), rtol=1e-6)
    value = fmt.largest - (fmt.middle if fmt.centred else 0)  # w = d * (q - middle) when centred
    np.testing.assert_allclose(got, sign * 2.0 * value, rtol=1e-6)  # 64 columns x 1/64


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("rows", [1, 5, 19, 45])
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_every_kernel_build_matches_the_reference(isa, rows, activation_bits, fmt, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the build the op picks
    # data of its own per build: an output row a build missed must not hold the last build's answer
    seed = [rows, activation_bits, FORMATS.index(fmt), ["generic", "avx2", "avx512"].index(isa)]
    rng = np.random.default_rng(seed)
    packed, scales = fmt.pack(*fmt.weight(rng, 50, 100))
    x = rng.normal(size=(rows, 100)).astype(np.float32)
    x[0, 32:64] = 0.0  # a block of zeros: no scale
    bias = rng.normal(size=50).astype(np.float32)
    arrays = {"x": x, "codes": packed, "scales": scales, "bias": bias}
    got = session(50, bias=True, activation_bits=activation_bits, fmt=fmt).run(None, arrays)[0]
    want = matmul_q(x, packed, scales, 50, bias, activation_bits, fmt.nonlinear)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("rows", [1, 19, 45])
@pytest.mark.parametrize("activation_bits", [8, 16])
@pytest.mark.parametrize("fmt", CENTRED, ids=str)
def test_a_centred_weight_answers_bit_for_bit_as_with_its_m_stored(isa, rows, activation_bits, fmt, monkeypatch):
    """MatMulQ4S forms m = -middle * d in the kernel, exactly, so it computes what MatMulQ4 computes with that m
    stored (how GGUF's Q4_0, Q5_0, Q8_0 and IQ4 were imported before op_version 13)."""
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    rng = np.random.default_rng([rows, activation_bits, CENTRED.index(fmt)])
    codes, d, m = fmt.weight(rng, 40, 1024)
    x = rng.normal(size=(rows, 1024)).astype(np.float32)
    centred = session(40, activation_bits=activation_bits, fmt=fmt)
    got = centred.run(None, dict(zip(("codes", "scales"), fmt.pack(codes, d, m)), x=x))[0]
    stored = QFormat(fmt.suffix[:-1], fmt.bits, fmt.nonlinear)
    plain = session(40, activation_bits=activation_bits, fmt=stored)
    assert np.array_equal(got, plain.run(None, dict(zip(("codes", "scales"), stored.pack(codes, d, m)), x=x))[0])


def test_no_rows_is_an_empty_result():
    packed, scales = pack_q(np.zeros((5, 64), np.uint8), np.ones((5, 2)), np.zeros((5, 2)))
    out = session(5).run(None, {"x": np.zeros((0, 64), np.float32), "codes": packed, "scales": scales})[0]
    assert out.shape == (0, 5)


def run(n, x_shape, codes_shape, scales_shape, bias_shape=None):
    arrays = {
        "x": np.ones(x_shape, np.float32),
        "codes": np.zeros(codes_shape, np.uint8),
        "scales": np.zeros(scales_shape, np.float16),
    }
    if bias_shape is not None:
        arrays["bias"] = np.zeros(bias_shape, np.float32)
    return session(n, bias=bias_shape is not None).run(None, arrays)


def test_codes_for_another_shape_are_rejected():
    with pytest.raises(Exception, match=r"codes must be \[ceil\(N / 16\), ceil\(K / 32\), 256\] = \[2, 2, 256\]"):
        run(20, (1, 64), (2, 3, 256), (2, 2, 2, 16))


def test_scales_for_another_shape_are_rejected():
    with pytest.raises(Exception, match=r"scales must be \[2, 2, 2, 16\], got \[2, 1, 2, 16\]"):
        run(20, (1, 64), (2, 2, 256), (2, 1, 2, 16))


def test_centred_scales_are_d_alone():
    """MatMulQ4S's scales are [G, KB, 16]: a [G, KB, 2, 16] pair (MatMulQ4's) is refused, naming the shape."""
    arrays = {"x": np.ones((1, 64), np.float32), "codes": np.zeros((2, 2, 256), np.uint8)}
    arrays["scales"] = np.zeros((2, 2, 2, 16), np.float16)
    fmt = CENTRED[0]
    node = helper.make_node("MatMulQ4S", ["x", "codes", "scales"], ["y"], domain=ortserve.ops.DOMAIN, N=20)
    graph = helper.make_graph(
        [node],
        "q4s",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "K"]),
            helper.make_tensor_value_info("codes", TensorProto.UINT8, ["G", "KB", 64 * fmt.bits]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT16, ["G", "KB", 2, 16]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", "N"])],
    )
    with pytest.raises(Exception, match=r"MatMulQ4S: scales must be \[2, 2, 16\], got \[2, 2, 2, 16\]"):
        make_session(op_model(graph)).run(None, arrays)


def test_a_bias_of_another_length_is_rejected():
    with pytest.raises(Exception, match=r"bias must be \[N\] = \[20\] \(or \[0\]: none\), got \[19\]"):
        run(20, (1, 64), (2, 2, 256), (2, 2, 2, 16), (19,))


def test_activation_bits_other_than_8_or_16_are_rejected():
    packed, scales = pack_q(np.zeros((5, 64), np.uint8), np.ones((5, 2)), np.zeros((5, 2)))
    with pytest.raises(Exception, match="attribute 'activation_bits' must be 8 or 16, got 4"):
        session(5, activation_bits=4).run(None, {"x": np.ones((1, 64), np.float32), "codes": packed, "scales": scales})


def test_a_missing_n_is_rejected():
    with pytest.raises(Exception, match="attribute 'N'"):
        run(None, (1, 64), (2, 2, 256), (2, 2, 2, 16))


def test_x_of_another_width_than_k_is_rejected():
    node = helper.make_node("MatMulQ4", ["x", "codes", "scales"], ["y"], domain=ortserve.ops.DOMAIN, N=20, K=64)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "q4",
        [
            helper.make_tensor_value_info("x", f, ["T", "K"]),
            helper.make_tensor_value_info("codes", TensorProto.UINT8, ["G", "KB", 256]),
            helper.make_tensor_value_info("scales", TensorProto.FLOAT16, ["G", "KB", 2, 16]),
        ],
        [helper.make_tensor_value_info("y", f, ["T", "N"])],
    )
    arrays = {"x": np.ones((1, 60), np.float32), "codes": np.zeros((2, 2, 256), np.uint8)}
    arrays["scales"] = np.zeros((2, 2, 2, 16), np.float16)
    with pytest.raises(Exception, match=r"x must be \[T, K = 64\], got \[1, 60\]"):
        make_session(op_model(graph)).run(None, arrays)


def gather_session(n: int, k: int, fmt: QFormat, scale_type: int = TensorProto.FLOAT16) -> ort.InferenceSession:
    node = helper.make_node(
        f"GatherQ{fmt.suffix}", ["codes", "scales", "ids"], ["y"], domain=ortserve.ops.DOMAIN, N=n, K=k
    )
    graph = helper.make_graph(
        [node],
        "gather",
        [
            helper.make_tensor_value_info("codes", TensorProto.UINT8, ["G", "KB", 64 * fmt.bits]),
            helper.make_tensor_value_info("scales", scale_type, fmt.scale_dims),
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["T"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", k])],
    )
    return make_session(op_model(graph))


@pytest.mark.parametrize("scale_dtype", [np.float16, np.float32])
@pytest.mark.parametrize("fmt", FORMATS, ids=str)
def test_gather_reads_the_dequantised_rows(fmt, scale_dtype):
    """A tied embedding's lookup on the LM head's codes: bit for bit d * q + m."""
    rng = np.random.default_rng(FORMATS.index(fmt))
    codes, d, m = fmt.weight(rng, 37, 70, scale_dtype)
    packed, scales = fmt.pack(codes, d, m, scale_dtype)
    ids = np.array([36, 0, 17, 17, 5], np.int64)
    scale_type = TensorProto.FLOAT16 if scale_dtype == np.float16 else TensorProto.FLOAT
    got = gather_session(37, 70, fmt, scale_type).run(None, {"codes": packed, "scales": scales, "ids": ids})[0]
    want = gather_q(packed, scales, ids, 37, 70, fmt.nonlinear)
    assert got.dtype == np.float32 and np.array_equal(got, want)
    blocks = np.arange(70) // 32
    values = Q4NL_CODES[codes] if fmt.nonlinear else codes
    assert np.array_equal(want, values[ids].astype(np.float32) * d[ids][:, blocks] + m[ids][:, blocks])


def test_gather_of_an_id_outside_the_rows_is_rejected():
    packed, scales = pack_q(np.zeros((20, 64), np.uint8), np.ones((20, 2)), np.zeros((20, 2)))
    with pytest.raises(Exception, match=r"index 20 at 1 is outside \[0, 20\)"):
        gather_session(20, 64, Q4).run(None, {"codes": packed, "scales": scales, "ids": np.array([3, 20], np.int64)})
