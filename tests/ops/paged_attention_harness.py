"""Helpers to run ortserve's PagedAttention op alone: a one-node model, a session, random batches.

Usable from any test (`tests/ops` is on sys.path for the tests in it):
    model = build_single_op_model(num_heads=14, num_kv_heads=2, head_size=64)
    session = make_session(model)
    output = run_op(session, batch)      # batch.key_cache / batch.value_cache are updated in place
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper
from ortserve.ops.paged_attention_reference import cache_row_width

import ortserve.ops

INPUTS = (
    "query",
    "key",
    "value",
    "key_cache",
    "value_cache",
    "slot_mapping",
    "block_tables",
    "context_lens",
    "query_start_loc",
)
OUTPUTS = ("output", "key_cache_out", "value_cache_out")


def build_single_op_model(
    num_heads,
    num_kv_heads,
    head_size,
    *,
    scale=0.0,
    sliding_window=0,
    softcap=0.0,
    ir_version=10,
    all_dims_symbolic=False,
) -> onnx.ModelProto:
    """A model holding one ortserve.PagedAttention node; batch and cache sizes are symbolic.
    all_dims_symbolic=True makes head widths symbolic too, so only the kernel checks them."""
    f, i64, i32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
    dim = (lambda n, name: name) if all_dims_symbolic else (lambda n, name: n)
    q_width, kv_width = dim(num_heads * head_size, "q_width"), dim(num_kv_heads * head_size, "kv_width")
    cache = ["num_blocks", dim(num_kv_heads, "num_kv_heads"), "block_size", dim(head_size, "head_size")]
    inputs = [
        helper.make_tensor_value_info("query", f, ["T", q_width]),
        helper.make_tensor_value_info("key", f, ["T", kv_width]),
        helper.make_tensor_value_info("value", f, ["T", kv_width]),
        helper.make_tensor_value_info("key_cache", f, cache),
        helper.make_tensor_value_info("value_cache", f, cache),
        helper.make_tensor_value_info("slot_mapping", i64, ["T"]),
        helper.make_tensor_value_info("block_tables", i32, ["B", "max_blocks"]),
        helper.make_tensor_value_info("context_lens", i32, ["B"]),
        helper.make_tensor_value_info("query_start_loc", i32, ["B_plus_1"]),
    ]
    outputs = [
        helper.make_tensor_value_info("output", f, ["T", q_width]),
        helper.make_tensor_value_info("key_cache_out", f, cache),
        helper.make_tensor_value_info("value_cache_out", f, cache),
    ]
    node = helper.make_node(
        "PagedAttention",
        list(INPUTS),
        list(OUTPUTS),
        domain=ortserve.ops.DOMAIN,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        scale=float(scale),
        sliding_window=sliding_window,
        softcap=float(softcap),
    )
    return op_model(helper.make_graph([node], "paged_attention", inputs, outputs), ir_version)


def op_model(graph: onnx.GraphProto, ir_version: int = 10) -> onnx.ModelProto:
    """A model of ``graph`` with the standard opset and ours."""
    return helper.make_model(
        graph,
        ir_version=ir_version,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid(ortserve.ops.DOMAIN, ortserve.ops.OPSET_VERSION),
        ],
    )


def make_session(model: onnx.ModelProto, threads: int = 2) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    ortserve.ops.register(options)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def matmul_session(
    op: str,
    n: int,
    scale_dims: list,
    scale_type: int = TensorProto.FLOAT16,
    bias: bool = False,
    activation_bits: int = 8,
) -> ort.InferenceSession:
    """A session of one quantised linear ``op`` (MatMulQ4K, MatMulQ3K, ...) of N = n: x [T, K], codes, scales of
    ``scale_dims`` (and a bias) -> y [T, N]."""
    inputs = ["x", "codes", "scales"] + (["bias"] if bias else [])
    node = helper.make_node(op, inputs, ["y"], domain=ortserve.ops.DOMAIN, N=n, activation_bits=activation_bits)
    graph = helper.make_graph(
        [node],
        op,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", "K"]),
            helper.make_tensor_value_info("codes", TensorProto.UINT8, ["G", "KB", "B"]),
            helper.make_tensor_value_info("scales", scale_type, scale_dims),
            *([helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["N"])] if bias else []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", "N"])],
    )
    return make_session(op_model(graph))


@functools.cache
def cached_session(
    num_heads, num_kv_heads, head_size, scale=0.0, sliding_window=0, softcap=0.0, threads=2
) -> ort.InferenceSession:
    model = build_single_op_model(
        num_heads, num_kv_heads, head_size, scale=scale, sliding_window=sliding_window, softcap=softcap
    )
    return make_session(model, threads)


@dataclasses.dataclass
class Batch:
    """The op's nine inputs as numpy arrays (field names = input names)."""

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    key_cache: np.ndarray
    value_cache: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    context_lens: np.ndarray
    query_start_loc: np.ndarray

    def copy(self) -> Batch:
        return Batch(**{k: v.copy() for k, v in dataclasses.asdict(self).items()})


def make_batch(
    rng, seqs, *, num_heads, num_kv_heads, head_size, block_size, num_blocks=None, skip_fraction=0.0
) -> Batch:
    """Random batch: seqs is [(q_len, context_len), ...]; each sequence owns random physical blocks,
    its last q_len positions are this step's new tokens, a skip_fraction of their slots is -1."""
    blocks_per_seq = [-(-ctx // block_size) for _, ctx in seqs]
    needed = sum(blocks_per_seq)
    num_blocks = num_blocks or needed + 3
    physical = rng.permutation(num_blocks)
    max_blocks = max(blocks_per_seq + [1])
    block_tables = np.zeros((len(seqs), max_blocks), np.int32)
    slots, used = [], 0
    for b, ((q_len, ctx), n) in enumerate(zip(seqs, blocks_per_seq)):
        block_tables[b, :n] = physical[used : used + n]
        used += n
        for pos in range(ctx - q_len, ctx):
            slot = block_tables[b, pos // block_size] * block_size + pos % block_size
            slots.append(-1 if rng.random() < skip_fraction else slot)
    T = sum(q for q, _ in seqs)
    kv_width = num_kv_heads * head_size
    cache_shape = (num_blocks, num_kv_heads, block_size, head_size)
    f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    return Batch(
        query=f32(T, num_heads * head_size),
        key=f32(T, kv_width),
        value=f32(T, kv_width),
        key_cache=f32(*cache_shape),
        value_cache=f32(*cache_shape),
        slot_mapping=np.array(slots, np.int64).reshape(T),
        block_tables=block_tables,
        context_lens=np.array([ctx for _, ctx in seqs], np.int32),
        query_start_loc=np.concatenate([[0], np.cumsum([q for q, _ in seqs])]).astype(np.int32),
    )


def run_op(session: ort.InferenceSession, batch: Batch, *, alias_caches: bool = True) -> np.ndarray:
    """Run the op through IOBinding with each cache bound as both input and output (in place)."""
    binding = session.io_binding()
    binding.bind_output("output", "cpu")  # first, so it is outputs[0]
    for name in INPUTS:
        if name in ("key_cache", "value_cache"):
            continue
        binding.bind_cpu_input(name, np.ascontiguousarray(getattr(batch, name)))
    for name in ("key_cache", "value_cache"):
        cache = ort.OrtValue.ortvalue_from_numpy(getattr(batch, name))
        binding.bind_ortvalue_input(name, cache)
        if alias_caches:
            binding.bind_ortvalue_output(name + "_out", cache)
        else:
            binding.bind_output(name + "_out", "cpu")
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


# --- PackedPagedAttention: packed qkv, in-op q/k norm and rotary -------------------------------------------

PACKED_INPUTS = (
    "qkv",
    "key_cache",
    "value_cache",
    "slot_mapping",
    "block_tables",
    "context_lens",
    "query_start_loc",
    "positions",
    "cos_cache",
    "sin_cache",
    "q_norm",
    "k_norm",
)


def build_packed_model(
    num_heads, num_kv_heads, head_size, *, optional_inputs=(), norm_epsilon=1e-6, cache_dtype=np.float32, **attrs
) -> onnx.ModelProto:
    """One PackedPagedAttention node taking the first 7 inputs and ``optional_inputs`` (a prefix
    of positions, cos_cache, sin_cache, q_norm, k_norm), with caches of ``cache_dtype``."""
    f, i64, i32 = TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32
    width = cache_row_width(cache_dtype, head_size)
    cache_type = helper.np_dtype_to_tensor_dtype(np.dtype(cache_dtype))
    cache = ["num_blocks", num_kv_heads, "block_size", width]
    types = {
        "qkv": (f, ["T", (num_heads + 2 * num_kv_heads) * head_size]),
        "key_cache": (cache_type, cache),
        "value_cache": (cache_type, cache),
        "slot_mapping": (i64, ["T"]),
        "block_tables": (i32, ["B", "max_blocks"]),
        "context_lens": (i32, ["B"]),
        "query_start_loc": (i32, ["B_plus_1"]),
        "positions": (i64, ["T"]),
        "cos_cache": (f, ["max_positions", "half"]),
        "sin_cache": (f, ["max_positions", "half"]),
        "q_norm": (f, [head_size]),
        "k_norm": (f, [head_size]),
    }
    names = list(PACKED_INPUTS[:7]) + list(optional_inputs)
    assert tuple(names) == PACKED_INPUTS[: len(names)], "optional inputs are positional: give a prefix"
    inputs = [helper.make_tensor_value_info(n, *types[n]) for n in names]
    outputs = [
        helper.make_tensor_value_info("output", f, ["T", num_heads * head_size]),
        helper.make_tensor_value_info("key_cache_out", cache_type, cache),
        helper.make_tensor_value_info("value_cache_out", cache_type, cache),
    ]
    node = helper.make_node(
        "PackedPagedAttention",
        names,
        list(OUTPUTS),
        domain=ortserve.ops.DOMAIN,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        norm_epsilon=float(norm_epsilon),
        **attrs,
    )
    graph = helper.make_graph([node], "paged_attention_packed", inputs, outputs)
    return helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid(ortserve.ops.DOMAIN, ortserve.ops.OPSET_VERSION),
        ],
    )


def run_packed(session: ort.InferenceSession, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Run a PackedPagedAttention node; arrays["key_cache"] / ["value_cache"] are updated in place."""
    binding = session.io_binding()
    binding.bind_output("output", "cpu")
    for graph_input in session.get_inputs():
        name = graph_input.name
        if name in ("key_cache", "value_cache"):
            cache = ort.OrtValue.ortvalue_from_numpy(arrays[name])
            binding.bind_ortvalue_input(name, cache)
            binding.bind_ortvalue_output(name + "_out", cache)
        else:
            binding.bind_cpu_input(name, np.ascontiguousarray(arrays[name]))
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]
