"""Folds the norm or the gated activation in front of a linear into the linear's own node: the input
stage of MatMulF and MatMulQ4 / Q5 / Q8 / Q4NL / Q4K / Q5K / Q6K / Q3K / Q2K / Q4XS (contrib_ops/linear_input.h, since
op_version 9).
Every node is a kernel launch, and a small model's decode step is mostly launches: a Llama layer goes from eight
nodes to five (qkv with the attention norm, attention, o, gate_up with the MLP norm, down with the
gated activation).

The pass runs on the builder's finished node list. A norm or activation is folded only when its output
feeds exactly one such linear as its x; anything else (a linear split by precision and concatenated,
Gemma's post-norms, GPT-2's LayerNorm) stays a node of its own. The linear takes
the folded node's place in the list, where all of its inputs exist, so the order stays topological.
"""

from __future__ import annotations

from collections import defaultdict

import onnx
from onnx import helper

from .graph_io import MS, OURS

# op: its weight inputs after x
# MatMulQ / GatherQ op suffixes
Q_FORMATS = ("4", "5", "8", "4NL", "4S", "5S", "8S", "4NLS", "4K", "5K", "6K", "3K", "2K", "4XS")
LINEARS = {"MatMulF": 1, **{f"MatMulQ{q}": 2 for q in Q_FORMATS}}
NO_BIAS = "const.f32.no_bias"  # a [0] tensor: the bias slot of a linear without one, before the stage's inputs


def fuse_linear_inputs(nodes: list[onnx.NodeProto]) -> list[onnx.NodeProto]:
    """The node list with each foldable norm and gated activation inside its linear (whose node is
    changed in place); the caller adds ``NO_BIAS`` if any node names it."""
    consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for node in nodes:
        for name in node.input:
            if name:
                consumers[name].append(node)
    moved: dict[int, onnx.NodeProto] = {}  # id of a folded node -> the linear that takes its place
    for node in nodes:
        linear = _only_linear_of(node.output[0], consumers) if node.output else None
        if linear is None:
            continue
        if node.op_type == "GatedActivation" and node.domain == OURS:
            linear.input[0] = node.input[0]
            linear.attribute.append(helper.make_attribute("gated", _attribute(node, "activation")))
            moved[id(node)] = linear
        elif _is_rms_norm(node) and not any(consumers[o] for o in node.output[1:3]):
            skip = node.op_type == "SkipSimplifiedLayerNormalization"
            x, residual, weight = (
                (node.input[0], node.input[1], node.input[2]) if skip else (node.input[0], "", node.input[1])
            )
            weights = LINEARS[linear.op_type]
            bias = linear.input[1 + weights] if len(linear.input) > 1 + weights else NO_BIAS
            inputs = [x, *linear.input[1 : 1 + weights], bias, weight] + ([residual] if residual else [])
            total = node.output[3] if skip and len(node.output) > 3 and consumers[node.output[3]] else ""
            del linear.input[:], linear.output[1:]
            linear.input.extend(inputs)
            if total:
                linear.output.append(total)
            linear.attribute.append(helper.make_attribute("norm_epsilon", float(_attribute(node, "epsilon"))))
            moved[id(node)] = linear
    placed = {id(linear) for linear in moved.values()}
    return [moved.get(id(node), node) for node in nodes if id(node) not in placed]


def _only_linear_of(name: str, consumers: dict[str, list[onnx.NodeProto]]) -> onnx.NodeProto | None:
    """The linear that reads ``name`` as its x, if it is the only reader and has no input stage yet."""
    users = consumers.get(name, [])
    if len(users) != 1:
        return None
    linear = users[0]
    if linear.domain != OURS or linear.op_type not in LINEARS or linear.input[0] != name:
        return None
    if any(a.name in ("gated", "norm_epsilon") for a in linear.attribute):
        return None
    return linear


def _is_rms_norm(node: onnx.NodeProto) -> bool:
    """An RMS norm over the last axis without a bias (the only kind the stage computes)."""
    if node.op_type == "SkipSimplifiedLayerNormalization" and node.domain == MS:
        return len(node.input) == 3
    if node.op_type == "SimplifiedLayerNormalization" and node.domain == "":
        return _attribute(node, "axis", -1) == -1 and len(node.input) == 2
    return False


def _attribute(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    if default is None:
        raise KeyError(f"{node.name}: no attribute {name!r}")
    return default
