"""AddBlockOffsets (y + block_sums(x) @ offsets) matches its numpy reference for every shape the
GGUF formats with float block minimums give, on any number of rows, with fp32 or fp16 offsets;
bad input names itself."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from ortserve.ops.paged_attention_reference import add_block_offsets as reference
from paged_attention_harness import make_session, op_model

import ortserve.ops


def session(block_size: int | None, offsets_type: int = TensorProto.FLOAT) -> ort.InferenceSession:
    attrs = {} if block_size is None else {"block_size": block_size}
    node = helper.make_node("AddBlockOffsets", ["x", "y", "offsets"], ["out"], domain=ortserve.ops.DOMAIN, **attrs)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [node],
        "offsets",
        [
            helper.make_tensor_value_info("x", f, ["T", "K"]),
            helper.make_tensor_value_info("y", f, ["T", "N"]),
            helper.make_tensor_value_info("offsets", offsets_type, ["B", "N"]),
        ],
        [helper.make_tensor_value_info("out", f, ["T", "N"])],
    )
    return make_session(op_model(graph))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("rows", [1, 3, 64, 150])
@pytest.mark.parametrize("k,n,block_size", [(576, 1728, 32), (64, 600, 16), (256, 17, 256)])
def test_matches_the_numpy_reference(rows, k, n, block_size, dtype):
    """fp16 offsets: up to 64 rows convert them as they stream, more rows all at once."""
    rng = np.random.default_rng(rows + k)
    x = rng.normal(0.0, 1.0, (rows, k)).astype(np.float32)
    y = rng.normal(0.0, 1.0, (rows, n)).astype(np.float32)
    offsets = rng.normal(0.0, 0.05, (k // block_size, n)).astype(dtype)
    offsets_type = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    got = session(block_size, offsets_type).run(None, {"x": x, "y": y, "offsets": offsets})[0]
    np.testing.assert_allclose(got, reference(x, y, offsets, block_size), rtol=1e-5, atol=2e-5)


def test_no_rows_is_an_empty_result():
    out = session(32).run(
        None,
        {"x": np.zeros((0, 64), np.float32), "y": np.zeros((0, 5), np.float32), "offsets": np.ones((2, 5), np.float32)},
    )[0]
    assert out.shape == (0, 5)


def run(block_size, x_shape, y_shape, offsets_shape):
    arrays = {
        "x": np.ones(x_shape, np.float32),
        "y": np.ones(y_shape, np.float32),
        "offsets": np.ones(offsets_shape, np.float32),
    }
    return session(block_size).run(None, arrays)


def test_k_that_is_not_a_multiple_of_the_block_is_rejected():
    with pytest.raises(Exception, match=r"x must be \[T, K\] with K a multiple of block_size 32, got \[2, 40\]"):
        run(32, (2, 40), (2, 4), (1, 4))


def test_offsets_for_another_k_are_rejected():
    with pytest.raises(Exception, match=r"offsets must be \[K / block_size = 2, N\], got \[3, 4\]"):
        run(32, (2, 64), (2, 4), (3, 4))


def test_y_of_another_shape_is_rejected():
    with pytest.raises(Exception, match=r"y must be \[T, N\] = \[2, 4\], got \[2, 5\]"):
        run(32, (2, 64), (2, 5), (2, 4))


def test_a_missing_block_size_is_rejected():
    with pytest.raises(Exception, match="attribute 'block_size' is required"):
        run(None, (2, 64), (2, 4), (2, 4))


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
def test_every_kernel_build_matches_the_reference(isa, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the build the op picks
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(5, 128)).astype(np.float32), rng.normal(size=(5, 300)).astype(np.float32)
    offsets = rng.normal(0.0, 0.05, (4, 300)).astype(np.float32)
    got = session(32).run(None, {"x": x, "y": y, "offsets": offsets})[0]
    np.testing.assert_allclose(got, reference(x, y, offsets, 32), rtol=1e-5, atol=2e-5)
