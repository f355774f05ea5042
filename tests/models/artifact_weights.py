"""An exported artifact's quantised linear weights, read back from its ONNX initialisers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from ortserve.export.linear_inputs import Q_FORMATS
from ortserve.ops.matmul_q_reference import dequantize_q, dequantize_sub16


def imported(artifact: Path, label: str) -> np.ndarray:
    """The [N, K] weight of the MatMulQ4 / Q5 / Q8 / Q4NL (or centred) / Q4K / Q5K / Q6K / Q3K / Q2K (or GatherQ) node
    ``label``, dequantised from its initialisers."""
    model = onnx.load(artifact / "model.onnx", load_external_data=False)
    onnx.external_data_helper.load_external_data_for_model(model, str(artifact))
    ops = [f"{kind}Q{suffix}" for kind in ("MatMul", "Gather") for suffix in Q_FORMATS]
    node = next(n for n in model.graph.node if n.op_type in ops and n.name.startswith(label))
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    init = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name.startswith(label)}
    codes, scales, n, k = init[f"{label}.codes"], init[f"{label}.scales"], attrs["N"], attrs["K"]
    if node.op_type.endswith(("Q6K", "Q3K", "Q2K")):
        return dequantize_sub16(codes, scales, n, k)
    return dequantize_q(codes, scales, n, k, "Q4NL" in node.op_type)
