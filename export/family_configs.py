"""Per-family config hooks: a Hugging Face ``config.json`` (as a dict) -> the ``ModelSpec`` the graph
builder reads. Defaults mirror the transformers config classes (checked in tests/export); the
architecture table (``architectures.py``) names the hook of each family.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import config as cfg
from .config import FULL, SLIDING, ModelSpec
from .errors import ExportError


def _defaults(c: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """config.json over the transformers class defaults (an explicit null stays null, as in HF)."""
    return {**defaults, **c}


def _decoder_spec(
    c: dict[str, Any],
    folder: Path,
    *,
    layer_types: list[str],
    sliding_window: int,
    ropes: dict[str, cfg.RopeSpec],
    scale: float | None = None,
    **extra: Any,
) -> ModelSpec:
    heads = int(c["num_attention_heads"])
    head_size = int(c.get("head_dim") or c["hidden_size"] // heads)
    layers = int(c["num_hidden_layers"])
    scale = scale if scale is not None else head_size**-0.5
    if len(layer_types) != layers or not set(layer_types) <= {FULL, SLIDING}:
        raise ExportError(
            f"config.json layer_types {layer_types} does not describe {layers} layers of '{FULL}' / '{SLIDING}'"
        )
    return ModelSpec(
        model_type=c["model_type"],
        num_layers=layers,
        hidden_size=int(c["hidden_size"]),
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_size=head_size,
        intermediate_size=int(c["intermediate_size"]),
        vocab_size=int(c["vocab_size"]),
        max_position_embeddings=int(c["max_position_embeddings"]),
        norm_eps=float(c["rms_norm_eps"]),
        tie_word_embeddings=bool(c["tie_word_embeddings"]),
        activation=cfg.activation(c.get("hidden_activation") or c["hidden_act"]),
        layer_types=tuple(layer_types),
        sliding_window=int(sliding_window or 0),
        ropes=ropes,
        attn_scales=(float(scale),) * layers,
        eos_token_ids=cfg.eos_token_ids(folder, c),
        **extra,
    )


def _one_rope(c: dict[str, Any]) -> dict[str, cfg.RopeSpec]:
    head_size = int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    return {
        FULL: cfg.rope_spec(c, head_size=head_size, max_pos=int(c["max_position_embeddings"]), default_theta=10000.0)
    }


_LLAMA = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=None,
    head_dim=None,
    hidden_act="silu",
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    eos_token_id=2,
)


def read_llama(c: dict[str, Any], folder: Path) -> ModelSpec:
    c = _defaults(c, _LLAMA)
    return _decoder_spec(c, folder, layer_types=[FULL] * c["num_hidden_layers"], sliding_window=0, ropes=_one_rope(c))


def read_mistral(c: dict[str, Any], folder: Path) -> ModelSpec:
    c = _defaults(
        c,
        {
            **_LLAMA,
            "intermediate_size": 14336,
            "num_key_value_heads": 8,
            "max_position_embeddings": 4096 * 32,
            "sliding_window": 4096,
        },
    )
    kind = SLIDING if c["sliding_window"] else FULL
    return _decoder_spec(
        c,
        folder,
        layer_types=[kind] * c["num_hidden_layers"],
        sliding_window=c["sliding_window"] or 0,
        ropes=_one_rope(c),
    )


def _read_qwen(c: dict[str, Any], folder: Path, defaults: dict[str, Any]) -> ModelSpec:
    c = _defaults(c, defaults)
    window = c["sliding_window"] if c.get("use_sliding_window") else None
    types = c.get("layer_types") or [
        SLIDING if window is not None and i >= c["max_window_layers"] else FULL for i in range(c["num_hidden_layers"])
    ]
    return _decoder_spec(c, folder, layer_types=list(types), sliding_window=window or 0, ropes=_one_rope(c))


_QWEN2 = {
    **_LLAMA,
    "vocab_size": 151936,
    "intermediate_size": 22016,
    "num_key_value_heads": 32,
    "max_position_embeddings": 32768,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "eos_token_id": None,
}


def read_qwen2(c: dict[str, Any], folder: Path) -> ModelSpec:
    return _read_qwen(c, folder, _QWEN2)


def read_qwen3(c: dict[str, Any], folder: Path) -> ModelSpec:
    return _read_qwen(c, folder, {**_QWEN2, "head_dim": 128})


def read_phi3(c: dict[str, Any], folder: Path) -> ModelSpec:
    c = _defaults(
        c,
        {
            **_LLAMA,
            "vocab_size": 32064,
            "hidden_size": 3072,
            "intermediate_size": 8192,
            "max_position_embeddings": 4096,
            "original_max_position_embeddings": 4096,
            "rms_norm_eps": 1e-5,
            "eos_token_id": 32000,
            "sliding_window": None,
        },
    )
    kind = SLIDING if c.get("sliding_window") else FULL
    return _decoder_spec(
        c,
        folder,
        layer_types=[kind] * c["num_hidden_layers"],
        sliding_window=c.get("sliding_window") or 0,
        ropes=_one_rope(c),
    )


_GEMMA = {
    **_LLAMA,
    "vocab_size": 256000,
    "hidden_size": 3072,
    "intermediate_size": 24576,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "hidden_act": "gelu_pytorch_tanh",
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "eos_token_id": 1,
}


def read_gemma(c: dict[str, Any], folder: Path) -> ModelSpec:
    c = {**_defaults(c, _GEMMA), "hidden_activation": None}  # Gemma 1 reads hidden_act only
    if c["hidden_act"] == "gelu":  # legacy Gemma configs say "gelu" and mean the tanh approximation
        c["hidden_act"] = "gelu_pytorch_tanh"
    return _decoder_spec(
        c,
        folder,
        layer_types=[FULL] * c["num_hidden_layers"],
        sliding_window=0,
        ropes=_one_rope(c),
        embed_scale=math.sqrt(c["hidden_size"]),
    )


def read_gemma2(c: dict[str, Any], folder: Path) -> ModelSpec:
    c = _defaults(
        c,
        {
            **_GEMMA,
            "vocab_size": 256000,
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 256,
            "sliding_window": 4096,
            "final_logit_softcapping": 30.0,
            "attn_logit_softcapping": 50.0,
        },
    )
    types = c.get("layer_types") or [SLIDING if (i + 1) % 2 else FULL for i in range(c["num_hidden_layers"])]
    return _decoder_spec(
        c,
        folder,
        layer_types=list(types),
        sliding_window=c["sliding_window"],
        ropes=_one_rope(c),
        scale=c["query_pre_attn_scalar"] ** -0.5,
        embed_scale=math.sqrt(c["hidden_size"]),
        attn_softcap=float(c.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(c.get("final_logit_softcapping") or 0.0),
    )


def read_gemma3(c: dict[str, Any], folder: Path) -> ModelSpec:
    if c.get("model_type") == "gemma3":
        raise ExportError(
            "multimodal Gemma 3 checkpoints (model_type 'gemma3') are not supported; "
            "export a text-only 'gemma3_text' checkpoint (e.g. gemma-3-1b)"
        )
    c = _defaults(
        c,
        {
            **_GEMMA,
            "vocab_size": 262208,
            "hidden_size": 2304,
            "intermediate_size": 9216,
            "num_hidden_layers": 26,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "max_position_embeddings": 131072,
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 256,
            "sliding_window": 4096,
        },
    )
    if c.get("use_bidirectional_attention"):
        raise ExportError("Gemma 3 with use_bidirectional_attention (an embedding model) is not supported")
    pattern = c.get("sliding_window_pattern", 6)
    types = c.get("layer_types") or [SLIDING if (i + 1) % pattern else FULL for i in range(c["num_hidden_layers"])]
    size, max_pos = int(c["head_dim"]), int(c["max_position_embeddings"])
    ropes = {
        FULL: cfg.rope_spec(c, head_size=size, max_pos=max_pos, default_theta=1_000_000.0, layer_type=FULL),
        SLIDING: cfg.rope_spec(
            c,
            head_size=size,
            max_pos=max_pos,
            default_theta=10_000.0,
            layer_type=SLIDING,
            legacy_theta_key="rope_local_base_freq",
            apply_legacy_scaling=False,
        ),
    }
    return _decoder_spec(
        c,
        folder,
        layer_types=list(types),
        sliding_window=c["sliding_window"],
        ropes=ropes,
        scale=c["query_pre_attn_scalar"] ** -0.5,
        embed_scale=math.sqrt(c["hidden_size"]),
        attn_softcap=float(c.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(c.get("final_logit_softcapping") or 0.0),
    )


def read_gpt2(c: dict[str, Any], folder: Path) -> ModelSpec:
    c = _defaults(
        c,
        dict(
            vocab_size=50257,
            n_positions=1024,
            n_embd=768,
            n_layer=12,
            n_head=12,
            n_inner=None,
            activation_function="gelu_new",
            layer_norm_epsilon=1e-5,
            scale_attn_weights=True,
            scale_attn_by_inverse_layer_idx=False,
            tie_word_embeddings=True,
            eos_token_id=50256,
        ),
    )
    hidden, heads, layers = int(c["n_embd"]), int(c["n_head"]), int(c["n_layer"])
    head_size = hidden // heads
    base = head_size**-0.5 if c["scale_attn_weights"] else 1.0
    scales = tuple(base / (i + 1) if c["scale_attn_by_inverse_layer_idx"] else base for i in range(layers))
    return ModelSpec(
        model_type="gpt2",
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        head_size=head_size,
        intermediate_size=int(c.get("n_inner") or 4 * hidden),
        vocab_size=int(c["vocab_size"]),
        max_position_embeddings=int(c["n_positions"]),
        norm_eps=float(c["layer_norm_epsilon"]),
        tie_word_embeddings=bool(c["tie_word_embeddings"]),
        activation=cfg.activation(c["activation_function"]),
        layer_types=(FULL,) * layers,
        attn_scales=scales,
        eos_token_ids=cfg.eos_token_ids(folder, c),
    )
