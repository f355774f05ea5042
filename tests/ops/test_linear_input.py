"""The input stage of MatMulF and MatMulQ4 / Q5 / Q8: the RMS norm in front of a linear (with the
residual add, its sum an output) or the gated activation before it runs inside the linear's node,
and the result is the reference's product on ``linear_input``'s rows, on every kernel build, for one
row (decode) and for chunks split over the pool; a bias of shape [0] stands for none; bad input
names itself."""

from __future__ import annotations

import re

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from ortserve.ops.matmul_q_reference import matmul_q, pack_q
from ortserve.ops.paged_attention_reference import linear_input
from paged_attention_harness import make_session, op_model

F = TensorProto.FLOAT
EPS = 1e-5
STAGES = {  # name: (node attributes, stage inputs after the bias, outputs)
    "norm": ({"norm_epsilon": EPS}, ["norm_weight"], ["y"]),
    "skip norm": ({"norm_epsilon": EPS}, ["norm_weight", "residual"], ["y", "sum"]),
    "skip norm, sum unused": ({"norm_epsilon": EPS}, ["norm_weight", "residual"], ["y"]),
    "silu": ({"gated": "silu"}, [], ["y"]),
    "gelu_tanh": ({"gated": "gelu_tanh"}, [], ["y"]),
}


def session(op: str, stage: str, w, n: int, k: int, bias: bool) -> ort.InferenceSession:
    attrs, extra, outputs = STAGES[stage]
    if op == "MatMulF":
        weights = [numpy_helper.from_array(w, "w")]
        inputs = ["x", "w"]
    else:
        packed, scales = w
        weights = [numpy_helper.from_array(packed, "codes"), numpy_helper.from_array(scales, "scales")]
        inputs = ["x", "codes", "scales"]
        attrs = {**attrs, "N": n, "K": k, "activation_bits": 16}
    node = helper.make_node(op, inputs + ["bias" if bias else "no_bias", *extra], outputs, domain="ortserve", **attrs)
    width = 2 * k if "norm" not in stage else k
    graph_inputs = [helper.make_tensor_value_info("x", F, ["T", width])]
    graph_inputs += [helper.make_tensor_value_info(name, F, None) for name in ["bias"] * bias + extra]
    weights.append(numpy_helper.from_array(np.zeros(0, np.float32), "no_bias"))
    graph = helper.make_graph(
        [node], "stage", graph_inputs, [helper.make_tensor_value_info(o, F, None) for o in outputs], weights
    )
    return make_session(op_model(graph))


def feeds(rng, stage: str, rows: int, k: int) -> dict[str, np.ndarray]:
    if "norm" not in stage:
        return {"x": rng.normal(size=(rows, 2 * k)).astype(np.float32)}
    out = {
        "x": rng.normal(size=(rows, k)).astype(np.float32),
        "norm_weight": rng.uniform(0.5, 1.5, k).astype(np.float32),
    }
    if "skip" in stage:
        out["residual"] = rng.normal(size=(rows, k)).astype(np.float32)
    return out


def expected_input(stage: str, given: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray | None]:
    attrs = STAGES[stage][0]
    return linear_input(
        given["x"],
        gated=attrs.get("gated"),
        norm_weight=given.get("norm_weight"),
        residual=given.get("residual"),
        norm_epsilon=attrs.get("norm_epsilon"),
    )


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("rows", [1, 3, 70])
@pytest.mark.parametrize("bias", [False, True])
def test_matmul_f_runs_its_input_stage_as_the_reference(isa, stage, rows, bias, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    rng = np.random.default_rng(rows)
    n, k = 40, 576  # 70 rows x 576 is split over the pool
    w = rng.normal(size=(n, k)).astype(np.float32)
    given = feeds(rng, stage, rows, k)
    b = rng.normal(size=n).astype(np.float32)
    got = session("MatMulF", stage, w, n, k, bias).run(None, given | ({"bias": b} if bias else {}))
    x, total = expected_input(stage, given)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + (b if bias else 0)
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T.astype(np.float64) + (np.abs(b) if bias else 0)
    np.testing.assert_array_less(np.abs(got[0] - want), 2e-6 * scale + 1e-30)
    if len(got) > 1:
        np.testing.assert_array_equal(got[1], total)  # x + residual in fp32: exactly


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("stage", list(STAGES))
@pytest.mark.parametrize("rows", [1, 70])
def test_matmul_q_runs_its_input_stage_as_the_reference(isa, bits, stage, rows, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)
    rng = np.random.default_rng(rows * 10 + bits)
    n, k = 48, 576
    codes = rng.integers(0, 1 << bits, (n, k), dtype=np.uint8)
    d = rng.uniform(0.001, 0.02, (n, k // 32)).astype(np.float16).astype(np.float32)
    m = rng.uniform(-0.15, 0.0, (n, k // 32)).astype(np.float16).astype(np.float32)
    packed, scales = pack_q(codes, d, m, bits, np.float16)
    given = feeds(rng, stage, rows, k)
    got = session(f"MatMulQ{bits}", stage, (packed, scales), n, k, bias=False).run(None, given)
    x, total = expected_input(stage, given)
    want = matmul_q(x, packed, scales, n, activation_bits=16)
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    if len(got) > 1:
        np.testing.assert_array_equal(got[1], total)


@pytest.mark.parametrize(
    "attrs, extra, feed, message",
    [
        ({"gated": "relu"}, [], {}, "attribute 'gated' must be 'silu' or 'gelu_tanh', got 'relu'"),
        ({}, ["norm_weight"], {"norm_weight": np.ones(8, np.float32)}, "attribute 'norm_epsilon' (>= 0) is required"),
        (
            {"norm_epsilon": EPS},
            ["norm_weight"],
            {"norm_weight": np.ones(7, np.float32)},
            "norm_weight must be [K] = [8], got [7]",
        ),
        (
            {"norm_epsilon": EPS},
            ["norm_weight", "residual"],
            {"norm_weight": np.ones(8, np.float32), "residual": np.ones((3, 8), np.float32)},
            "residual must be [T, K] = [2, 8], got [3, 8]",
        ),
        ({"gated": "silu"}, [], {"x": np.ones((2, 8), np.float32)}, "x must be [T, 2K = 16], got [2, 8]"),
    ],
)
def test_bad_stage_input_names_itself(attrs, extra, feed, message):
    w = np.ones((4, 8), np.float32)
    node = helper.make_node("MatMulF", ["x", "w", "no_bias", *extra], ["y"], domain="ortserve", **attrs)
    graph = helper.make_graph(
        [node],
        "bad",
        [helper.make_tensor_value_info(name, F, None) for name in ["x", *extra]],
        [helper.make_tensor_value_info("y", F, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.zeros(0, np.float32), "no_bias")],
    )
    width = 16 if attrs.get("gated") in ("silu", "gelu_tanh") else 8
    given = {"x": np.ones((2, width), np.float32)} | feed
    with pytest.raises(Exception, match=r"MatMulF: .*" + re.escape(message)):
        make_session(op_model(graph)).run(None, given)
