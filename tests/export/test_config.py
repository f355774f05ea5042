"""Our torch-free config reading agrees with transformers' config classes: the same defaults for
every field we read, and the same meaning for the legacy spellings real checkpoints still use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ortserve.export.architectures import ARCHITECTURES, SUPPORTED_MODEL_TYPES, architecture_for
from ortserve.export.config import FULL, SLIDING
from ortserve.export.errors import ExportError


def spec_of(config: dict, folder: Path):
    return architecture_for(config["model_type"]).read_config(config, folder)


def hf_view(config) -> dict:
    """The fields ModelSpec holds, as transformers' config object states them."""
    c = config
    get = lambda *names: next((getattr(c, n) for n in names if getattr(c, n, None) is not None), None)
    heads = get("num_attention_heads", "n_head")
    return dict(
        num_layers=get("num_hidden_layers", "n_layer"),
        hidden_size=get("hidden_size", "n_embd"),
        num_heads=heads,
        num_kv_heads=get("num_key_value_heads") or heads,
        head_size=get("head_dim") or get("hidden_size", "n_embd") // heads,
        vocab_size=c.vocab_size,
        max_position_embeddings=get("max_position_embeddings", "n_positions"),
        norm_eps=get("rms_norm_eps", "layer_norm_epsilon"),
        tie_word_embeddings=c.tie_word_embeddings,
        layer_types=tuple(getattr(c, "layer_types", None) or [FULL] * get("num_hidden_layers", "n_layer")),
    )


def ours_view(spec) -> dict:
    return {key: getattr(spec, key) for key in hf_view_keys}


hf_view_keys = (
    "num_layers",
    "hidden_size",
    "num_heads",
    "num_kv_heads",
    "head_size",
    "vocab_size",
    "max_position_embeddings",
    "norm_eps",
    "tie_word_embeddings",
    "layer_types",
)


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_defaults_match_transformers_config_classes(model_type, tmp_path):
    """A config.json holding only model_type reads like transformers' class defaults."""
    from transformers import AutoConfig

    reference = AutoConfig.for_model(model_type)
    ours = spec_of({"model_type": model_type}, tmp_path)
    if model_type == "mistral":  # transformers keeps the window but Mistral ignores layer_types
        assert ours.layer_types == (SLIDING,) * ours.num_layers and ours.sliding_window == reference.sliding_window
    else:
        assert ours_view(ours)["layer_types"] == hf_view(reference)["layer_types"]
    assert {k: v for k, v in ours_view(ours).items() if k != "layer_types"} == {
        k: v for k, v in hf_view(reference).items() if k != "layer_types"
    }
    assert ours == spec_of(reference.to_dict(), tmp_path)


def test_every_architecture_is_listed_once():
    types = [t for arch in ARCHITECTURES for t in arch.model_types]
    assert len(types) == len(set(types))
    assert {"llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3_text", "gpt2"} <= set(types)


def test_unsupported_architecture_names_the_supported_ones():
    with pytest.raises(ExportError, match="'falcon' is not supported; supported: llama, mistral"):
        architecture_for("falcon")


def test_legacy_llama3_rope_scaling_reads_like_rope_parameters(tmp_path):
    legacy = {
        "model_type": "llama",
        "rope_theta": 500000.0,
        "max_position_embeddings": 131072,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    current = {
        "model_type": "llama",
        "max_position_embeddings": 131072,
        "rope_parameters": {**legacy["rope_scaling"], "rope_theta": 500000.0},
    }
    rope = spec_of(legacy, tmp_path).ropes[FULL]
    assert rope == spec_of(current, tmp_path).ropes[FULL]
    assert (rope.kind, rope.theta, rope.get("factor"), rope.original_max_position_embeddings) == (
        "llama3",
        500000.0,
        32.0,
        8192,
    )


def test_legacy_gemma3_config_reads_like_transformers(tmp_path):
    """rope_local_base_freq, rope_scaling (global layers only) and sliding_window_pattern."""
    from transformers import AutoConfig

    legacy = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 8,
        "rope_theta": 1000000.0,
        "rope_local_base_freq": 10000.0,
        "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        "sliding_window_pattern": 4,
        "sliding_window": 512,
    }
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    reference = AutoConfig.from_pretrained(tmp_path)
    ours = spec_of(legacy, tmp_path)
    assert list(ours.layer_types) == reference.layer_types
    for layer_type in (FULL, SLIDING):
        params = reference.rope_parameters[layer_type]
        rope = ours.ropes[layer_type]
        assert (rope.kind, rope.theta, rope.get("factor")) == (
            params["rope_type"],
            params["rope_theta"],
            params.get("factor"),
        )


@pytest.mark.parametrize("use_sliding_window", [False, True])
def test_qwen2_sliding_layers_follow_max_window_layers(use_sliding_window, tmp_path):
    from transformers import AutoConfig

    config = {
        "model_type": "qwen2",
        "num_hidden_layers": 4,
        "use_sliding_window": use_sliding_window,
        "sliding_window": 256,
        "max_window_layers": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    reference = AutoConfig.from_pretrained(tmp_path)
    ours = spec_of(config, tmp_path)
    assert list(ours.layer_types) == reference.layer_types
    assert ours.sliding_window == (256 if use_sliding_window else 0)


def test_gemma_scales_and_softcaps(tmp_path):
    g2 = spec_of({"model_type": "gemma2", "hidden_size": 2304, "query_pre_attn_scalar": 144}, tmp_path)
    assert g2.embed_scale == pytest.approx(2304**0.5)
    assert g2.attn_scales[0] == pytest.approx(144**-0.5)
    assert (g2.attn_softcap, g2.final_softcap) == (50.0, 30.0)
    assert g2.activation == "gelu_tanh"
    legacy_gemma = spec_of({"model_type": "gemma", "hidden_act": "gelu"}, tmp_path)
    assert legacy_gemma.activation == "gelu_tanh"  # what transformers substitutes for Gemma


def test_eos_ids_come_from_generation_config(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    assert spec_of({"model_type": "llama", "eos_token_id": 2}, tmp_path).eos_token_ids == (2, 7)


def test_unknown_rope_type_is_a_clear_error(tmp_path):
    with pytest.raises(ExportError, match="rope_type 'mrope' is not supported"):
        spec_of({"model_type": "qwen2", "rope_scaling": {"type": "mrope"}}, tmp_path)
