"""The rotary rows our graph computes each step (and the ``dynamic`` table) equal transformers' (its
rope init functions, float32) for every type."""

from __future__ import annotations

import numpy as np
import pytest
from ortserve.export.architectures import architecture_for
from ortserve.export.config import FULL
from ortserve.export.graph_io import IR_VERSION, OPSETS
from ortserve.export.rope import RopeFrequencies, RopeTable, rope_frequencies, rope_step_nodes

HEAD = 64
ROPES = {
    "default": dict(rope_type="default", rope_theta=10000.0),
    "linear": dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
    "llama3": dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
    ),
    "yarn": dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64),
    "yarn_mscale": dict(
        rope_type="yarn",
        rope_theta=10000.0,
        factor=4.0,
        original_max_position_embeddings=64,
        mscale=1.0,
        mscale_all_dim=0.5,
        beta_fast=16,
        beta_slow=2,
    ),
    "dynamic": dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0),
}


def reference_cos_sin(config, positions, seq_len=None):
    import torch
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = config.rope_parameters
    init = ROPE_INIT_FUNCTIONS.get(params["rope_type"])
    if init is None:  # default
        dim = int(HEAD * params.get("partial_rotary_factor", 1.0))
        inv = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        scale = 1.0
    else:
        inv, scale = init(config, "cpu", seq_len=seq_len)
    angles = torch.tensor(positions, dtype=torch.float32)[:, None] * inv[None, :].float()
    return (angles.cos() * scale).numpy(), (angles.sin() * scale).numpy()


def hf_config(rope: dict, max_pos: int = 256, **extra):
    from transformers import AutoConfig

    return AutoConfig.for_model(
        "llama",
        hidden_size=HEAD * 4,
        num_attention_heads=4,
        head_dim=HEAD,
        max_position_embeddings=max_pos,
        rope_parameters=dict(rope),
        **extra,
    )


def graph_rows(freqs: RopeFrequencies, positions) -> tuple[np.ndarray, np.ndarray]:
    """Run ``rope_step_nodes`` in onnxruntime on one step's positions: its (cos, sin) rows."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    nodes, consts, outputs = rope_step_nodes(freqs, "rope")
    graph = helper.make_graph(
        nodes,
        "rope",
        [helper.make_tensor_value_info("positions", TensorProto.INT64, [None])],
        [
            helper.make_tensor_value_info(name, kind, None)
            for name, kind in zip(outputs, (TensorProto.INT64, TensorProto.FLOAT, TensorProto.FLOAT))
        ],
        initializer=consts,
    )
    model = helper.make_model(graph, opset_imports=OPSETS[:1], ir_version=IR_VERSION)
    positions = np.asarray(positions, np.int64)
    rows, cos, sin = ort.InferenceSession(model.SerializeToString()).run(None, {"positions": positions})
    np.testing.assert_array_equal(rows, np.arange(len(positions)))  # the op reads row t for token t
    return cos, sin


def frequencies(config, tmp_path, model_type: str = "llama", max_model_len: int = 256):
    spec = architecture_for(model_type).read_config(config.to_dict(), tmp_path).ropes[FULL]
    return rope_frequencies(spec, max_model_len)


@pytest.mark.parametrize("name", [n for n in ROPES if n != "dynamic"])
def test_step_rows_match_transformers(name, tmp_path):
    config = hf_config(ROPES[name])
    positions = [*range(256), 4095, 32767, 131071]  # far positions: onnxruntime's Cos/Sin stay exact
    cos, sin = graph_rows(frequencies(config, tmp_path), positions)
    ref_cos, ref_sin = reference_cos_sin(config, positions)
    np.testing.assert_allclose(cos, ref_cos, atol=2e-6)
    np.testing.assert_allclose(sin, ref_sin, atol=2e-6)


def test_step_rows_follow_the_positions_not_the_order(tmp_path):
    """A flattened batch: two sequences' positions interleaved, a decode at a far position."""
    config = hf_config(ROPES["default"])
    positions = [7, 0, 1, 2, 3000, 8]
    cos, sin = graph_rows(frequencies(config, tmp_path), positions)
    ref_cos, ref_sin = reference_cos_sin(config, positions)
    np.testing.assert_allclose(cos, ref_cos, atol=2e-6)
    np.testing.assert_allclose(sin, ref_sin, atol=2e-6)


def test_dynamic_rows_past_the_trained_length_use_that_lengths_base(tmp_path):
    """Within max_position_embeddings: plain rope. Row p beyond it: the NTK base transformers
    computes when the sequence reaches p + 1 tokens (what it uses to decode position p). Its
    frequencies depend on the position, so it is the one type kept as a table."""
    config = hf_config(ROPES["dynamic"], max_pos=64)
    table = frequencies(config, tmp_path, max_model_len=200)
    assert isinstance(table, RopeTable) and table.cos.shape == (200, HEAD // 2)
    for p in (0, 63, 64, 100, 199):
        cos, sin = reference_cos_sin(config, [p], seq_len=max(p + 1, 64) if p >= 64 else None)
        np.testing.assert_allclose(table.cos[p], cos[0], atol=2e-6)
        np.testing.assert_allclose(table.sin[p], sin[0], atol=2e-6)


def longrope_config():
    from transformers import AutoConfig

    rope = dict(
        rope_type="longrope",
        rope_theta=10000.0,
        short_factor=[1.0 + 0.05 * i for i in range(32)],
        long_factor=[1.5 + 0.1 * i for i in range(32)],
    )
    return AutoConfig.for_model(
        "phi3",
        hidden_size=HEAD * 4,
        num_attention_heads=4,
        max_position_embeddings=512,
        original_max_position_embeddings=128,
        rope_parameters=rope,
    )


def test_longrope_step_uses_long_factors_once_any_position_reaches_the_original_length(tmp_path):
    config = longrope_config()
    freqs = frequencies(config, tmp_path, "phi3", max_model_len=512)
    short = [0, 1, 50, 127]
    cos, _ = graph_rows(freqs, short)
    np.testing.assert_allclose(cos, reference_cos_sin(config, short, seq_len=100)[0], atol=2e-6)
    mixed = [0, 1, 50, 128, 400]  # one position past 128: every row of the step turns by the long factors
    cos, sin = graph_rows(freqs, mixed)
    long_cos, long_sin = reference_cos_sin(config, mixed, seq_len=300)
    np.testing.assert_allclose(cos, long_cos, atol=2e-6)
    np.testing.assert_allclose(sin, long_sin, atol=2e-6)


def test_longrope_within_the_original_length_has_only_short_factors(tmp_path):
    freqs = frequencies(longrope_config(), tmp_path, "phi3", max_model_len=128)
    assert freqs.long_inv is None


def test_partial_rotary_rows_cover_only_the_rotary_dims(tmp_path):
    from transformers import AutoConfig

    config = AutoConfig.for_model("phi3", hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.75)
    freqs = frequencies(config, tmp_path, "phi3", max_model_len=16)
    assert freqs.inv.shape == (24,)
    assert graph_rows(freqs, [0, 5])[0].shape == (2, 24)


def test_artifact_size_does_not_grow_with_the_context_length(tiny_checkpoint, tmp_path):
    """Gemma 3's two ropes are computed per step: no table of every position in the weights."""
    from ortserve.export import export_model

    checkpoint = tiny_checkpoint("gemma3_local_global")
    short = export_model(checkpoint, tmp_path / "short", max_model_len=16, progress=False)
    full = export_model(checkpoint, tmp_path / "full", progress=False)
    assert full.max_model_len == 128 and full.weight_bytes == short.weight_bytes
