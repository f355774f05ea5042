"""Supported architectures: each one is data (weight names, block shape, GGUF layout) plus a
config hook.

The graph builder (``graph.py``) emits one decoder for all of them; an ``Architecture`` says only
what differs, as onnxruntime-genai's per-model builders do, without a class hierarchy.
Defaults in the hooks mirror the transformers config classes (checked in tests). ``GgufLayout``
says how llama.cpp's ``convert_hf_to_gguf.py`` stores the family, so reading a GGUF file undoes
exactly that (``gguf_checkpoint.py``) and its metadata becomes a config (``ortserve.models``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from . import config as cfg
from .config import FULL, SLIDING, ModelSpec
from .errors import ExportError


@dataclass(frozen=True)
class WeightNames:
    """Module paths in the checkpoint (``.weight`` / ``.bias`` appended); ``{i}`` is the layer."""

    embed: str = "model.embed_tokens"
    final_norm: str = "model.norm"
    lm_head: str = "lm_head"
    pos_embed: str | None = None
    attn_norm: str = "model.layers.{i}.input_layernorm"
    mlp_norm: str = "model.layers.{i}.post_attention_layernorm"
    attn_post_norm: str | None = None
    mlp_post_norm: str | None = None
    q: str | None = "model.layers.{i}.self_attn.q_proj"
    k: str | None = "model.layers.{i}.self_attn.k_proj"
    v: str | None = "model.layers.{i}.self_attn.v_proj"
    qkv: str | None = None  # one fused projection instead of q, k, v
    o: str = "model.layers.{i}.self_attn.o_proj"
    q_norm: str | None = None
    k_norm: str | None = None
    gate: str | None = "model.layers.{i}.mlp.gate_proj"
    up: str = "model.layers.{i}.mlp.up_proj"
    gate_up: str | None = None  # one fused [gate; up] projection
    down: str = "model.layers.{i}.mlp.down_proj"


@dataclass(frozen=True)
class GgufLayout:
    """What llama.cpp's converter does to this family's tensors, and so what reading undoes."""

    arch: str  # GGUF general.architecture
    permute_qk: bool = False  # Q/K rows (and biases) reordered for llama.cpp's rotary (Llama)
    norm_shift: float = 0.0  # added to every *norm.weight (Gemma's x * (1 + w) folded in)
    transposed: tuple[str, ...] = ()  # modules Hugging Face stores [in, out] (GPT-2's Conv1D)
    name_hint: str = ""  # general.name contains this (Mistral files say "llama")


@dataclass(frozen=True)
class Architecture:
    name: str
    model_types: tuple[str, ...]
    read_config: Callable[[dict[str, Any], Path], ModelSpec]
    names: WeightNames = WeightNames()
    gguf: GgufLayout | None = None
    norm: Literal["rms", "rms_offset", "layer"] = "rms"  # rms_offset: x_hat * (1 + w) (Gemma)
    gated_mlp: bool = True  # down(act(gate(x)) * up(x)) vs down(act(up(x)))
    conv1d: bool = False  # linear weights stored [in, out] (GPT-2)
    strip_prefixes: tuple[str, ...] = ()  # prefixes some checkpoints omit


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


_GEMMA2_NAMES = WeightNames(
    mlp_norm="model.layers.{i}.pre_feedforward_layernorm",
    attn_post_norm="model.layers.{i}.post_attention_layernorm",
    mlp_post_norm="model.layers.{i}.post_feedforward_layernorm",
)
_QK_NORM = dict(q_norm="model.layers.{i}.self_attn.q_norm", k_norm="model.layers.{i}.self_attn.k_norm")
_GPT2_NAMES = WeightNames(
    embed="transformer.wte",
    pos_embed="transformer.wpe",
    final_norm="transformer.ln_f",
    lm_head="lm_head",
    attn_norm="transformer.h.{i}.ln_1",
    mlp_norm="transformer.h.{i}.ln_2",
    q=None,
    k=None,
    v=None,
    qkv="transformer.h.{i}.attn.c_attn",
    o="transformer.h.{i}.attn.c_proj",
    gate=None,
    up="transformer.h.{i}.mlp.c_fc",
    down="transformer.h.{i}.mlp.c_proj",
)

ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("llama", ("llama",), read_llama, gguf=GgufLayout("llama", permute_qk=True)),
    Architecture("mistral", ("mistral",), read_mistral, gguf=GgufLayout("llama", permute_qk=True, name_hint="mistral")),
    Architecture("qwen2", ("qwen2",), read_qwen2, gguf=GgufLayout("qwen2")),
    Architecture("qwen3", ("qwen3",), read_qwen3, WeightNames(**_QK_NORM), gguf=GgufLayout("qwen3")),
    Architecture(
        "phi3",
        ("phi3",),
        read_phi3,
        WeightNames(
            q=None,
            k=None,
            v=None,
            qkv="model.layers.{i}.self_attn.qkv_proj",
            gate=None,
            gate_up="model.layers.{i}.mlp.gate_up_proj",
        ),
        gguf=GgufLayout("phi3"),
    ),
    Architecture("gemma", ("gemma",), read_gemma, norm="rms_offset", gguf=GgufLayout("gemma", norm_shift=1.0)),
    Architecture(
        "gemma2", ("gemma2",), read_gemma2, _GEMMA2_NAMES, norm="rms_offset", gguf=GgufLayout("gemma2", norm_shift=1.0)
    ),
    Architecture(
        "gemma3",
        ("gemma3_text", "gemma3"),
        read_gemma3,
        WeightNames(**{**_GEMMA2_NAMES.__dict__, **_QK_NORM}),
        norm="rms_offset",
        gguf=GgufLayout("gemma3", norm_shift=1.0),
    ),
    Architecture(
        "gpt2",
        ("gpt2",),
        read_gpt2,
        _GPT2_NAMES,
        norm="layer",
        gated_mlp=False,
        conv1d=True,
        strip_prefixes=("transformer.",),
        gguf=GgufLayout("gpt2", transposed=("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")),
    ),
)
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(t for a in ARCHITECTURES for t in a.model_types if t != "gemma3")


def architecture_for_gguf(gguf_arch: str, model_name: str = "") -> Architecture:
    """The architecture of a GGUF file's ``general.architecture`` (and ``general.name``)."""
    candidates = [a for a in ARCHITECTURES if a.gguf is not None and a.gguf.arch == gguf_arch]
    for arch in sorted(candidates, key=lambda a: not a.gguf.name_hint):  # type: ignore[union-attr]
        if arch.gguf.name_hint.lower() in model_name.lower():  # type: ignore[union-attr]
            return arch
    supported = sorted({a.gguf.arch for a in ARCHITECTURES if a.gguf is not None})
    raise ExportError(
        f"GGUF architecture '{gguf_arch}' is not supported; supported: {', '.join(supported)}. "
        "Convert the model to a Hugging Face checkpoint another way and export that directory"
    )


def architecture_for(model_type: str) -> Architecture:
    for arch in ARCHITECTURES:
        if model_type in arch.model_types:
            return arch
    raise ExportError(f"architecture '{model_type}' is not supported; supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
