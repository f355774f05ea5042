"""An exported artifact's quantised linear weights, read back from its ONNX initialisers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from ortserve.export.nbits import QuantizedWeight, dequantize
from ortserve.ops.paged_attention_reference import dequantize_q


def imported(artifact: Path, label: str) -> np.ndarray:
    """The [N, K] weight of the MatMulQ4 / Q5 / Q8 / Q4NL or MatMulNBits node ``label``, dequantised from
    its initialisers."""
    model = onnx.load(artifact / "model.onnx", load_external_data=False)
    onnx.external_data_helper.load_external_data_for_model(model, str(artifact))
    ops = ("MatMulQ4", "MatMulQ5", "MatMulQ8", "MatMulQ4NL", "MatMulNBits")
    node = next(n for n in model.graph.node if n.op_type in ops and n.name.startswith(label))
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.startswith(label)}
    n, k = attrs["N"], attrs["K"]
    if node.op_type != "MatMulNBits":
        nonlinear = node.op_type == "MatMulQ4NL"
        return dequantize_q(init[f"{label}.codes"], init[f"{label}.scales"], n, k, nonlinear)
    bits, block = attrs["bits"], attrs["block_size"]
    scales = init[f"{label}.scales"].reshape(n, -1)
    zero_points = init.get(f"{label}.zero_points")
    if zero_points is None:  # the kernel's default: the code midpoint
        midpoint = np.full(scales.shape, 1 << (bits - 1), np.uint8)
        zero_points = midpoint if bits == 8 else midpoint[:, 0::2] | (midpoint[:, 1::2] << 4)
    offsets = init.get(f"{label}.offsets")
    q = QuantizedWeight(
        init[f"{label}.qweight"], scales, zero_points, bits, block, None if offsets is None else offsets.T
    )
    return dequantize(q, k)
