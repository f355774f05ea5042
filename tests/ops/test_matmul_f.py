"""MatMulF (y = x @ W.T + bias in fp32, W repacked into panels of 32 rows) matches numpy in float64 on
every shape a model gives it (rows not a multiple of 32, K not a multiple of 4, one row, a batch of
decode rows, a prefill chunk longer than one tile), with W a constant (packed once) or an input
(packed per call), with and without bias, on every kernel build; bad input names itself."""

from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from paged_attention_harness import make_session, op_model

import ortserve.ops

F = TensorProto.FLOAT


def session(w: np.ndarray | None = None, bias: bool = False, threads: int = 2) -> ort.InferenceSession:
    """W as a constant initializer when given, else as the input "w"."""
    inputs = ["x", "w"] + (["bias"] if bias else [])
    node = helper.make_node("MatMulF", inputs, ["y"], domain=ortserve.ops.DOMAIN)
    graph_inputs = [helper.make_tensor_value_info("x", F, ["T", "K"])]
    if w is None:
        graph_inputs.append(helper.make_tensor_value_info("w", F, ["N", "K"]))
    if bias:
        graph_inputs.append(helper.make_tensor_value_info("bias", F, ["N"]))
    initializers = [] if w is None else [numpy_helper.from_array(w, "w")]
    graph = helper.make_graph(
        [node], "f", graph_inputs, [helper.make_tensor_value_info("y", F, ["T", "N"])], initializers
    )
    return make_session(op_model(graph), threads=threads)


def reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    y = x.astype(np.float64) @ w.astype(np.float64).T
    return y + bias if bias is not None else y


def check(got: np.ndarray, x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None) -> None:
    want = reference(x, w, bias)
    # fp32 sums in another order: the error grows with K and the size of the terms
    scale = np.abs(x).astype(np.float64) @ np.abs(w).astype(np.float64).T + (0 if bias is None else np.abs(bias))
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_less(np.abs(got - want), 1e-6 * scale + 1e-30)


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx512"])
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 9, 13, 16, 19, 70])
@pytest.mark.parametrize("n, k", [(50, 100), (33, 7), (1, 1), (96, 576)])
def test_every_kernel_build_matches_numpy(isa, rows, n, k, monkeypatch):
    monkeypatch.setenv("ORTSERVE_KERNEL_ISA", isa)  # caps the build the op picks
    rng = np.random.default_rng(rows * 1000 + n)
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(rows, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    check(session(w, bias=True).run(None, {"x": x, "bias": bias})[0], x, w, bias)
    check(session(w).run(None, {"x": x})[0], x, w)


@pytest.mark.parametrize("streams", ["1", "8"])
@pytest.mark.parametrize("n, k", [(50, 100), (33, 7), (96, 576), (40, 1003)])
def test_one_row_as_one_stream_or_eight_matches_numpy(streams, n, k, monkeypatch):
    # one row of x (decode) reads a panel as 1 stream (Zen 4's choice) or 8 (every other AVX-512 CPU's),
    # K % 8 steps on the first stream; each must be exact wherever it runs (the other builds ignore it)
    monkeypatch.setenv("ORTSERVE_F_ROW_STREAMS", streams)
    rng = np.random.default_rng(n * 7 + k)
    w = rng.normal(size=(n, k)).astype(np.float32)
    x = rng.normal(size=(1, k)).astype(np.float32)
    bias = rng.normal(size=n).astype(np.float32)
    check(session(w, bias=True).run(None, {"x": x, "bias": bias})[0], x, w, bias)


@pytest.mark.parametrize("rows", [1, 3, 70])
def test_a_weight_that_is_an_input_is_packed_per_call(rows):
    rng = np.random.default_rng(rows)
    s = session()
    for n in (40, 64):  # one session, two weights of different shapes
        w = rng.normal(size=(n, 37)).astype(np.float32)
        x = rng.normal(size=(rows, 37)).astype(np.float32)
        check(s.run(None, {"x": x, "w": w})[0], x, w)


def test_one_thread_and_two_give_the_same_result():
    """Tasks split the panels (and, for long chunks, the rows); each output has one owner, so the
    result does not depend on the thread count."""
    rng = np.random.default_rng(7)
    w = rng.normal(size=(300, 200)).astype(np.float32)
    for rows in (1, 4, 130):
        x = rng.normal(size=(rows, 200)).astype(np.float32)
        one = session(w, threads=1).run(None, {"x": x})[0]
        two = session(w, threads=2).run(None, {"x": x})[0]
        np.testing.assert_array_equal(one, two)
        check(two, x, w)


def test_no_rows_is_an_empty_result():
    out = session(np.ones((5, 8), np.float32)).run(None, {"x": np.zeros((0, 8), np.float32)})[0]
    assert out.shape == (0, 5)


@pytest.mark.parametrize(
    "x_shape, w_shape, bias_shape, message",
    [
        ((2, 9), (4, 8), None, "x must be [T, K = 8], got [2, 9]"),
        ((2, 3, 8), (4, 8), None, "x must be [T, K = 8], got [2, 3, 8]"),
        ((2, 8), (4, 8), (5,), "bias must be [N] = [4] (or [0]: none), got [5]"),
        ((2, 8), (4, 8, 1), None, "W must be [N, K] with N, K > 0, got [4, 8, 1]"),
    ],
)
def test_bad_shapes_name_the_input(x_shape, w_shape, bias_shape, message):
    inputs = ["x", "w"] + (["bias"] if bias_shape else [])
    node = helper.make_node("MatMulF", inputs, ["y"], domain=ortserve.ops.DOMAIN)
    values = [helper.make_tensor_value_info("x", F, None), helper.make_tensor_value_info("w", F, None)]
    if bias_shape:
        values.append(helper.make_tensor_value_info("bias", F, None))
    graph = helper.make_graph([node], "f", values, [helper.make_tensor_value_info("y", F, None)])
    feed = {"x": np.ones(x_shape, np.float32), "w": np.ones(w_shape, np.float32)}
    if bias_shape:
        feed["bias"] = np.ones(bias_shape, np.float32)
    with pytest.raises(Exception, match=re.escape(f"MatMulF: {message}")):
        make_session(op_model(graph)).run(None, feed)


def resident_kib(path) -> int:
    """Resident KiB of this process's mappings of ``path`` (onnxruntime maps each external
    initializer on its own)."""
    total, inside = 0, False
    for line in open("/proc/self/smaps"):
        if "-" in line.split(" ", 1)[0]:
            inside = line.rstrip().endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


def test_the_weights_pages_are_released_once_packed_and_a_tied_gather_still_reads_them(tmp_path):
    """The op keeps its own packed copy, so onnxruntime's mapping of the data file is handed back
    (MADV_PAGEOUT): RSS holds the weights once, not twice. A Gather of the same initializer (a tied
    embedding) reads its rows back from the file."""
    rng = np.random.default_rng(3)
    w = rng.normal(size=(4096, 1024)).astype(np.float32)  # 16 MiB
    nodes = [
        helper.make_node("Gather", ["w", "ids"], ["rows"]),
        helper.make_node("MatMulF", ["rows", "w"], ["y"], domain=ortserve.ops.DOMAIN),
    ]
    graph = helper.make_graph(
        nodes,
        "tied",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["T"])],
        [helper.make_tensor_value_info("y", F, ["T", 4096]), helper.make_tensor_value_info("rows", F, ["T", 1024])],
        [numpy_helper.from_array(w, "w")],
    )
    model = op_model(graph)
    onnx.save_model(model, tmp_path / "m.onnx", save_as_external_data=True, location="m.onnx.data")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    ortserve.ops.register(options)
    s = ort.InferenceSession(str(tmp_path / "m.onnx"), options, providers=["CPUExecutionProvider"])
    assert resident_kib(tmp_path / "m.onnx.data") < 1024  # of 16 MiB
    ids = np.array([5, 4095, 0], np.int64)
    y, rows = s.run(None, {"ids": ids})
    np.testing.assert_array_equal(rows, w[ids])
    check(y, w[ids], w)
