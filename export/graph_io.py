"""The graph's signature, as the engine's model runner binds it: the step inputs (``STEP_INPUTS``),
a key and a value cache per layer (input and output, the same buffer at run time), and the logits."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from ortserve.artifact import LOGITS_OUTPUT, STEP_INPUTS, ArtifactManifest

from .config import ModelSpec

MS, OURS = "com.microsoft", "ortserve"
OPSETS = [helper.make_opsetid("", 21), helper.make_opsetid(MS, 1), helper.make_opsetid(OURS, 1)]
IR_VERSION = 10  # onnxruntime 1.31 loads IR <= 13; onnx 1.23 would write 14


def make_model(spec: ModelSpec, nodes: list[onnx.NodeProto], constants: list[onnx.TensorProto]) -> onnx.ModelProto:
    cache = [("num_blocks", spec.num_kv_heads, "block_size", spec.head_size)]
    inputs = [
        helper.make_tensor_value_info(i.name, helper.np_dtype_to_tensor_dtype(np.dtype(i.dtype)), list(i.dims))
        for i in STEP_INPUTS
    ]
    outputs = [helper.make_tensor_value_info(LOGITS_OUTPUT, TensorProto.FLOAT, ["num_logits", spec.vocab_size])]
    for i in range(spec.num_layers):
        names = (
            (ArtifactManifest.key_cache_input(i), ArtifactManifest.key_cache_output(i)),
            (ArtifactManifest.value_cache_input(i), ArtifactManifest.value_cache_output(i)),
        )
        for name_in, name_out in names:
            inputs.append(helper.make_tensor_value_info(name_in, TensorProto.FLOAT, *cache))
            outputs.append(helper.make_tensor_value_info(name_out, TensorProto.FLOAT, *cache))
    graph = helper.make_graph(nodes, f"ortserve_{spec.model_type}", inputs, outputs, constants)
    return helper.make_model(graph, opset_imports=OPSETS, producer_name="ortserve.export", ir_version=IR_VERSION)
