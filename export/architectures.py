"""Supported architectures: each one is data (weight names, block shape, GGUF layout) plus a
config hook.

The graph builder (``graph.py``) emits one decoder for all of them; an ``Architecture`` says only
what differs, as onnxruntime-genai's per-model builders do, without a class hierarchy.
Defaults in the hooks mirror the transformers config classes (checked in tests). ``GgufLayout``
says how llama.cpp's ``convert_hf_to_gguf.py`` stores the family, so reading a GGUF file undoes
exactly that (``gguf_checkpoint.py``) and its metadata becomes a config (``ortserve.models``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .config import ModelSpec
from .errors import ExportError
from .family_configs import (
    read_gemma,
    read_gemma2,
    read_gemma3,
    read_gpt2,
    read_llama,
    read_mistral,
    read_phi3,
    read_qwen2,
    read_qwen3,
)


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
