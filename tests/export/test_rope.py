"""Our numpy rotary tables equal transformers' (its rope init functions, float32) for every type."""

from __future__ import annotations

import numpy as np
import pytest
from ortserve.export.architectures import architecture_for
from ortserve.export.config import FULL
from ortserve.export.rope import rope_table

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


@pytest.mark.parametrize("name", [n for n in ROPES if n != "dynamic"])
def test_static_tables_match_transformers(name, tmp_path):
    config = hf_config(ROPES[name])
    spec = architecture_for("llama").read_config(config.to_dict(), tmp_path).ropes[FULL]
    table = rope_table(spec, 256)
    cos, sin = reference_cos_sin(config, np.arange(256))
    np.testing.assert_allclose(table.cos, cos, atol=2e-6)
    np.testing.assert_allclose(table.sin, sin, atol=2e-6)


def test_dynamic_rows_past_the_trained_length_use_that_lengths_base(tmp_path):
    """Within max_position_embeddings: plain rope. Row p beyond it: the NTK base transformers
    computes when the sequence reaches p + 1 tokens (what it uses to decode position p)."""
    config = hf_config(ROPES["dynamic"], max_pos=64)
    spec = architecture_for("llama").read_config(config.to_dict(), tmp_path).ropes[FULL]
    table = rope_table(spec, 200)
    for p in (0, 63, 64, 100, 199):
        cos, sin = reference_cos_sin(config, [p], seq_len=max(p + 1, 64) if p >= 64 else None)
        np.testing.assert_allclose(table.cos[p], cos[0], atol=2e-6)
        np.testing.assert_allclose(table.sin[p], sin[0], atol=2e-6)


def test_longrope_table_holds_short_rows_then_long_rows(tmp_path):
    from transformers import AutoConfig

    rope = dict(
        rope_type="longrope",
        rope_theta=10000.0,
        short_factor=[1.0 + 0.05 * i for i in range(32)],
        long_factor=[1.5 + 0.1 * i for i in range(32)],
    )
    config = AutoConfig.for_model(
        "phi3",
        hidden_size=HEAD * 4,
        num_attention_heads=4,
        max_position_embeddings=512,
        original_max_position_embeddings=128,
        rope_parameters=rope,
    )
    spec = architecture_for("phi3").read_config(config.to_dict(), tmp_path).ropes[FULL]
    table = rope_table(spec, 512)
    assert table.long_offset == 128 and table.cos.shape == (128 + 512, 32)
    short_cos, _ = reference_cos_sin(config, np.arange(128), seq_len=100)
    long_cos, long_sin = reference_cos_sin(config, np.arange(512), seq_len=300)
    np.testing.assert_allclose(table.cos[:128], short_cos, atol=2e-6)
    np.testing.assert_allclose(table.cos[128:], long_cos, atol=2e-6)
    np.testing.assert_allclose(table.sin[128:], long_sin, atol=2e-6)


def test_partial_rotary_table_covers_only_the_rotary_dims(tmp_path):
    from transformers import AutoConfig

    config = AutoConfig.for_model("phi3", hidden_size=256, num_attention_heads=4, partial_rotary_factor=0.75)
    spec = architecture_for("phi3").read_config(config.to_dict(), tmp_path).ropes[FULL]
    assert spec.rotary_dim == 48
    assert rope_table(spec, 16).cos.shape == (16, 24)
