"""GatedActivation (act(gate) * up for x = [gate | up]) matches its numpy reference for both
activations, every width (vector tails included) and row count; bad input names itself."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from ortserve.ops.paged_attention_reference import gated_activation as reference
from paged_attention_harness import make_session, op_model

import ortserve.ops


def session(activation: str | None) -> ort.InferenceSession:
    attrs = {} if activation is None else {"activation": activation}
    node = helper.make_node("GatedActivation", ["x"], ["y"], domain=ortserve.ops.DOMAIN, **attrs)
    graph = helper.make_graph(
        [node],
        "gated",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "two_i"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", "i"])],
    )
    return make_session(op_model(graph))


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("rows,inner", [(1, 1536), (3, 17), (37, 64), (130, 100)])
def test_matches_the_numpy_reference(activation, rows, inner):
    x = np.random.default_rng(rows).normal(0.0, 3.0, (rows, 2 * inner)).astype(np.float32)
    got = session(activation).run(None, {"x": x})[0]
    expected = reference(x, activation)
    assert got.shape == (rows, inner)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_extreme_gates_stay_finite(activation):
    x = np.array([[-1e4, -90.0, 0.0, 90.0, 1e4, 1e4, 1e4, 1e4, 1e4, 1e4]], np.float32)
    got = session(activation).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, reference(x, activation), rtol=1e-6, atol=1e-30)


def test_an_unknown_activation_is_rejected_naming_the_choices():
    x = np.ones((1, 4), np.float32)
    with pytest.raises(Exception, match="activation must be 'silu' or 'gelu_tanh', got 'relu'"):
        session("relu").run(None, {"x": x})


def test_a_missing_activation_is_rejected():
    with pytest.raises(Exception, match="attribute 'activation' is required"):
        session(None).run(None, {"x": np.ones((1, 4), np.float32)})


def test_an_odd_width_is_rejected():
    with pytest.raises(Exception, match="x must be \\[T, 2\\*I\\] \\(gate then up\\), got rank 2 with an odd width 5"):
        session("silu").run(None, {"x": np.ones((2, 5), np.float32)})


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_every_kernel_build_matches_the_reference(isa, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the build the op picks
    x = np.random.default_rng(7).normal(0.0, 3.0, (9, 2 * 100)).astype(np.float32)
    for activation in ("silu", "gelu_tanh"):
        np.testing.assert_allclose(
            session(activation).run(None, {"x": x})[0], reference(x, activation), rtol=2e-6, atol=2e-6
        )
