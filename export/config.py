"""What the graph builder needs to know about a model, read from ``config.json`` without torch.

Why not ``transformers.AutoConfig`` or optimum's ``NormalizedConfig``: importing any transformers
config class imports ``modeling_rope_utils``, which imports torch whenever torch is installed
(about 230 MB of RSS and 0.7 s), and export must stay torch-free and inside its memory budget.
So each architecture reads the handful of fields it needs from the JSON, with the same defaults
as its transformers config class (``tests/export/test_config.py`` checks them against
``AutoConfig`` for every supported ``model_type``), and handles the legacy spellings
(``rope_scaling``, top-level ``rope_theta``, ``rope_local_base_freq``, ``sliding_window_pattern``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from .errors import ExportError

Activation = Literal["silu", "gelu_tanh", "gelu", "relu"]
ACTIVATIONS: dict[str, Activation] = {
    "silu": "silu",
    "swish": "silu",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "relu": "relu",
}
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class RopeSpec:
    """One rotary table: ``kind`` is a transformers rope_type; ``params`` its scaling fields."""

    kind: str
    theta: float
    rotary_dim: int
    max_position_embeddings: int
    original_max_position_embeddings: int
    params: tuple[tuple[str, Any], ...] = ()

    def get(self, key: str, default: Any = None) -> Any:
        return dict(self.params).get(key, default)


@dataclass(frozen=True)
class ModelSpec:
    """Sizes and per-layer behaviour of one decoder, independent of where it came from."""

    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    norm_eps: float
    tie_word_embeddings: bool
    activation: Activation
    layer_types: tuple[str, ...]  # FULL or SLIDING per layer
    sliding_window: int = 0  # tokens; 0 = none
    ropes: dict[str, RopeSpec] = field(default_factory=dict)  # layer type -> table ({} = no rope)
    attn_scales: tuple[float, ...] = ()  # per layer; softmax scale of q.k
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    embed_scale: float = 1.0
    eos_token_ids: tuple[int, ...] = ()

    def rope_key(self, layer: int) -> str:
        """Which rotary table a layer uses (Gemma 3: its own for sliding layers)."""
        return self.layer_types[layer] if self.layer_types[layer] in self.ropes else FULL

    def window_for(self, layer: int) -> int:
        return self.sliding_window if self.layer_types[layer] == SLIDING else 0


def read_config_json(folder: Path) -> dict[str, Any]:
    path = folder / "config.json"
    if not path.is_file():
        raise ExportError(
            f"{folder} has no config.json: SRC must be a Hugging Face checkpoint "
            "directory, a .gguf file or a built-in model name"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExportError(f"{path} is not valid JSON ({exc}); the checkpoint looks corrupt") from exc
    if not isinstance(config, dict) or "model_type" not in config:
        raise ExportError(f"{path} has no 'model_type'; the checkpoint looks corrupt")
    return config


def activation(name: str) -> Activation:
    if name not in ACTIVATIONS:
        raise ExportError(f"activation '{name}' is not supported; supported: {', '.join(sorted(ACTIVATIONS))}")
    return ACTIVATIONS[name]


def rope_spec(
    config: dict[str, Any],
    *,
    head_size: int,
    max_pos: int,
    default_theta: float,
    layer_type: str | None = None,
    legacy_theta_key: str = "rope_theta",
    apply_legacy_scaling: bool = True,
) -> RopeSpec:
    """Normalise the v5 ``rope_parameters`` and the legacy ``rope_scaling``/``rope_theta`` spellings."""
    params = dict(config.get("rope_parameters") or {})
    if layer_type is not None and isinstance(params.get(layer_type), dict):
        params = dict(params[layer_type])
    elif layer_type is not None and any(isinstance(v, dict) for v in params.values()):
        params = {}
    legacy = dict(config.get("rope_scaling") or {}) if apply_legacy_scaling else {}
    merged = {**legacy, **params}
    kind = merged.get("rope_type") or merged.get("type") or "default"
    kind = {"su": "longrope", "linear_scaling": "linear"}.get(kind, kind)
    if kind not in ROPE_TYPES:
        raise ExportError(f"rope_type '{kind}' is not supported; supported: {', '.join(ROPE_TYPES)}")
    theta = merged.get("rope_theta", config.get(legacy_theta_key, default_theta))
    partial = merged.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) or 1.0
    original = (
        config.get("original_max_position_embeddings") or merged.get("original_max_position_embeddings") or max_pos
    )
    keep = (
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
        "short_factor",
        "long_factor",
    )
    extra = tuple(
        (k, tuple(v) if isinstance(v, list) else v) for k, v in sorted(merged.items()) if k in keep and v is not None
    )
    return RopeSpec(
        kind=kind,
        theta=float(theta),
        rotary_dim=int(head_size * partial),
        max_position_embeddings=int(max_pos),
        original_max_position_embeddings=int(original),
        params=extra,
    )


def eos_token_ids(folder: Path, config: dict[str, Any]) -> tuple[int, ...]:
    """EOS ids from generation_config.json (what generation uses), else config.json."""
    value = None
    generation = folder / "generation_config.json"
    if generation.is_file():
        try:
            value = json.loads(generation.read_text()).get("eos_token_id")
        except (OSError, json.JSONDecodeError):
            value = None
    if value is None:
        value = config.get("eos_token_id")
    if value is None:
        return ()
    return tuple(int(v) for v in (value if isinstance(value, list) else [value]))
