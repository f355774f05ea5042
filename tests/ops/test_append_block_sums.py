"""ortserve.AppendBlockSums against its numpy reference, and its errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from ortserve.ops.paged_attention_reference import append_block_sums
from paged_attention_harness import make_session

import ortserve.ops


def block_sums_session(block_size: int | None = 32, rank: int = 2):
    dims = ["T", "K", "X"][:rank]
    attrs = {} if block_size is None else {"block_size": block_size}
    node = helper.make_node("AppendBlockSums", ["x"], ["y"], domain=ortserve.ops.DOMAIN, **attrs)
    graph = helper.make_graph(
        [node],
        "append_block_sums",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", "W"])],
    )
    model = helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid(ortserve.ops.DOMAIN, ortserve.ops.OPSET_VERSION),
        ],
    )
    return make_session(model, threads=1)


@pytest.mark.parametrize(
    "rows, k, block_size", [(1, 32, 32), (1, 576, 32), (7, 1536, 32), (512, 896, 32), (3, 48, 16), (0, 64, 32)]
)
def test_matches_the_numpy_reference(rows, k, block_size):
    x = np.random.default_rng(rows * k).standard_normal((rows, k)).astype(np.float32) * 10
    (y,) = block_sums_session(block_size).run(None, {"x": x})
    assert y.shape == (rows, k + k // block_size)
    np.testing.assert_array_equal(y[:, :k], x)  # x itself is copied unchanged
    np.testing.assert_allclose(y, append_block_sums(x, block_size), rtol=1e-5, atol=1e-4)


def run_expecting(session, x, *fragments):
    with pytest.raises(Exception) as info:
        session.run(None, {"x": x})
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_k_that_is_not_a_multiple_of_the_block_is_rejected():
    run_expecting(
        block_sums_session(32),
        np.zeros((2, 40), np.float32),
        "AppendBlockSums",
        "K = 40 columns, not a multiple of block_size = 32",
    )


def test_input_that_is_not_2d_is_rejected():
    run_expecting(
        block_sums_session(32, rank=3), np.zeros((2, 32, 1), np.float32), "x must be 2-D [tokens, K]; got rank 3"
    )


def test_missing_block_size_is_rejected():
    run_expecting(
        block_sums_session(None), np.zeros((1, 32), np.float32), "attribute 'block_size' is required and must be > 0"
    )
