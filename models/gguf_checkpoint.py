"""GGUF file -> Hugging Face checkpoint directory, without torch.

Serving never needs torch, and a GGUF is exported on its first ``ortserve serve``, so this does
what ``AutoModelForCausalLM.from_pretrained(d, gguf_file=f)`` does, without torch: the config
from the file's metadata (transformers' own GGUF key table, plus what llama.cpp implies but does
not write, per family, in ``_CONFIG_HOOKS``), the tokenizer and chat template by transformers'
torch-free GGUF tokenizer converter, and the weights read by ``ortserve.export``'s
``GgufCheckpoint`` (layout fixes are data in the architecture table).

Output: ``config.json``, ``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``
(when the file has a template), ``generation_config.json``, and either ``model.gguf`` (a link to
the file, or to a split GGUF's first shard, beside which export finds the others: what export reads,
keeping the file's quantised codes) or ``model.safetensors`` (fp32,
``weights=True``: a checkpoint transformers loads, for validation and tests).
"""

from __future__ import annotations

import json
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .chat_templates import builtin_template
from .registry import ModelSourceError

logger = logging.getLogger(__name__)

# Bump when the output changes: cached conversions with another version are redone.
CONVERTER_VERSION = 2
GGUF_WEIGHTS = "model.gguf"

# Tokens that end a chat turn in common templates: a stop token when the template uses it.
_TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def convert_gguf(gguf_path: Path, out_dir: Path, *, weights: bool = True, progress: bool = True) -> None:
    """Write the checkpoint of ``gguf_path`` (a file, or a split GGUF's first shard) into the existing, empty
    ``out_dir``."""
    from ortserve.export import ExportError
    from ortserve.export.gguf_checkpoint import read_gguf

    try:
        model = read_gguf(Path(gguf_path))
    except ExportError as exc:
        raise ModelSourceError(str(exc)) from exc
    metadata = model.metadata
    arch = _architecture(metadata, gguf_path)
    config = _config(metadata, model, arch)
    config.save_pretrained(out_dir)
    tokenizer = _tokenizer(metadata)
    tokenizer.save_pretrained(out_dir)
    _generation_config(metadata, tokenizer).save_pretrained(out_dir)
    if weights:
        _write_weights(gguf_path, arch, config.to_dict(), out_dir / "model.safetensors", progress=progress)
    else:
        os.symlink(Path(gguf_path).resolve(), out_dir / GGUF_WEIGHTS)


def _architecture(metadata: dict[str, Any], gguf_path: Path):
    from ortserve.export import ExportError
    from ortserve.export.architectures import architecture_for_gguf

    try:
        return architecture_for_gguf(str(metadata.get("general.architecture")), str(metadata.get("general.name", "")))
    except ExportError as exc:
        raise ModelSourceError(f"{gguf_path}: {exc}") from exc


# ---- config ------------------------------------------------------------------------------------
def _table_values(metadata: dict[str, Any], gguf_arch: str) -> dict[str, Any]:
    """Config values through transformers' GGUF key table (Gemma 1 reads Gemma 2's keys)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    table = GGUF_CONFIG_MAPPING.get(gguf_arch) or GGUF_CONFIG_MAPPING["gemma2" if gguf_arch == "gemma" else "llama"]
    values = {}
    for key, target in table.items():
        if target not in (None, -1) and f"{gguf_arch}.{key}" in metadata:
            values[target] = metadata[f"{gguf_arch}.{key}"]
    return values


def _key(metadata: dict[str, Any], key: str, default: Any = None) -> Any:
    return metadata.get(f"{metadata['general.architecture']}.{key}", default)


def _rope_scaling(metadata: dict[str, Any]) -> dict[str, Any]:
    """llama.cpp's rope.scaling.* (linear, yarn) as rope_parameters fields."""
    kind, factor = _key(metadata, "rope.scaling.type"), _key(metadata, "rope.scaling.factor")
    if kind == "linear" and factor:
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn" and factor:
        return {
            "rope_type": "yarn",
            "factor": float(factor),
            "original_max_position_embeddings": int(_key(metadata, "rope.scaling.original_context_length")),
        }
    return {}


def _freq_factors(model, names: tuple[str, ...]) -> list[list[float]] | None:
    tensors = {t.name: t for t in model.tensors}
    if not all(n in tensors for n in names):
        return None
    return [np.asarray(tensors[n].data, np.float32).ravel().tolist() for n in names]


def _llama(metadata: dict[str, Any], model, values: dict[str, Any]) -> dict[str, Any]:
    names = {t.name for t in model.tensors}
    extra = {"attention_bias": "blk.0.attn_q.bias" in names, "mlp_bias": "blk.0.ffn_up.bias" in names}
    rope = {"rope_type": "default", "rope_theta": values.get("rope_theta", 10000.0), **_rope_scaling(metadata)}
    factors = _freq_factors(model, ("rope_freqs.weight",))
    if factors:  # Llama 3's frequency factors, as llama.cpp stores them: inv_freq / factor
        rope = {
            "rope_type": "longrope",
            "rope_theta": rope["rope_theta"],
            "short_factor": factors[0],
            "long_factor": factors[0],
            "attention_factor": 1.0,
            "original_max_position_embeddings": values["max_position_embeddings"],
        }
    extra["rope_parameters"] = rope
    if metadata["general.architecture"] == "llama" and "mistral" in str(metadata.get("general.name", "")).lower():
        extra["sliding_window"] = None  # llama.cpp's "llama" has no sliding window
    return extra


def _phi3(metadata: dict[str, Any], model, values: dict[str, Any]) -> dict[str, Any]:
    head_dim = values["hidden_size"] // values["num_attention_heads"]
    rope: dict[str, Any] = {
        "rope_type": "default",
        "rope_theta": values.get("rope_theta", 10000.0),
        "partial_rotary_factor": int(_key(metadata, "rope.dimension_count", head_dim)) / head_dim,
    }
    factors = _freq_factors(model, ("rope_factors_short.weight", "rope_factors_long.weight"))
    original = _key(metadata, "rope.scaling.original_context_length")
    if factors:
        rope.update(rope_type="longrope", short_factor=factors[0], long_factor=factors[1])
        if _key(metadata, "rope.scaling.attn_factor") is not None:
            rope["attention_factor"] = float(_key(metadata, "rope.scaling.attn_factor"))
    return {
        "rope_parameters": rope,
        "original_max_position_embeddings": int(original or values["max_position_embeddings"]),
        "sliding_window": int(_key(metadata, "attention.sliding_window", 0)) or None,
    }


def _gemma(metadata: dict[str, Any], model, values: dict[str, Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {"hidden_activation": "gelu_pytorch_tanh", "hidden_act": "gelu_pytorch_tanh"}
    gguf_arch = metadata["general.architecture"]
    if gguf_arch == "gemma":
        return extra
    # llama.cpp scales queries by 1/sqrt(head_dim), by 1/sqrt(hidden / heads) for the 27B models
    big = values["num_hidden_layers"] == {"gemma2": 46, "gemma3": 62}[gguf_arch]
    head_dim = values.get("head_dim") or values["hidden_size"] // values["num_attention_heads"]
    extra["query_pre_attn_scalar"] = values["hidden_size"] // values["num_attention_heads"] if big else head_dim
    window = _key(metadata, "attention.sliding_window")
    extra["final_logit_softcapping"] = _key(metadata, "final_logit_softcapping")
    if gguf_arch == "gemma2":
        extra["attn_logit_softcapping"] = _key(metadata, "attn_logit_softcapping")
        extra["sliding_window"] = int(window or 4096)
        return extra
    pattern = int(_key(metadata, "attention.sliding_window_pattern", 6) or 1)
    layers = values["num_hidden_layers"]
    full = {"rope_type": "default", "rope_theta": values.get("rope_theta", 1_000_000.0), **_rope_scaling(metadata)}
    sliding = {"rope_type": "default", "rope_theta": float(_key(metadata, "rope.freq_base_swa", 10000.0))}
    extra.update(
        model_type="gemma3_text",
        sliding_window=int(window or 4096),
        layer_types=["sliding_attention" if window and (i + 1) % pattern else "full_attention" for i in range(layers)],
        rope_parameters={"full_attention": full, "sliding_attention": sliding},
    )
    return extra


def _gpt2(metadata: dict[str, Any], model, values: dict[str, Any]) -> dict[str, Any]:
    return {
        "n_positions": values.pop("n_ctx"),
        "n_inner": values.pop("feed_forward_length", None),
        "activation_function": "gelu_new",
    }


_CONFIG_HOOKS: dict[str, Callable[[dict[str, Any], Any, dict[str, Any]], dict[str, Any]]] = {
    "llama": _llama,
    "phi3": _phi3,
    "gemma": _gemma,
    "gemma2": _gemma,
    "gemma3": _gemma,
    "gpt2": _gpt2,
}


def _config(metadata: dict[str, Any], model, arch):
    """The transformers config: the key table, the family's hook, then what holds for all."""
    from transformers import AutoConfig

    gguf_arch = metadata["general.architecture"]
    values = _table_values(metadata, gguf_arch)
    values.setdefault("vocab_size", len(metadata["tokenizer.ggml.tokens"]))
    if _key(metadata, "attention.key_length") and gguf_arch != "phi3":  # head_dim may differ from hidden / heads
        values.setdefault("head_dim", int(_key(metadata, "attention.key_length")))
    hook = _CONFIG_HOOKS.get(gguf_arch)
    if hook is not None:
        values.update(hook(metadata, model, values))
    if "rope_parameters" in values:
        values.pop("rope_theta", None)
    model_type = values.pop("model_type", arch.model_types[0])
    values["tie_word_embeddings"] = all(t.name != "output.weight" for t in model.tensors)
    for role, key in (("bos", "bos"), ("eos", "eos"), ("pad", "padding"), ("unk", "unknown")):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None:
            values[f"{role}_token_id"] = int(token_id)
    config = AutoConfig.for_model(model_type, **values)
    config.architectures = [config.__class__.__name__.replace("Config", "ForCausalLM")]
    config.dtype = "float32"
    return config


# ---- tokenizer ---------------------------------------------------------------------------------
def _tokenizer(metadata: dict[str, Any]):
    """A fast tokenizer built by transformers' GGUF tokenizer converter (torch-free)."""
    from transformers import TokenizersBackend
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_TOKENIZER_MAPPING,
        convert_gguf_tokenizer,
    )

    groups = {
        group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
        for group, renames in GGUF_TOKENIZER_MAPPING.items()
    }
    tokenizer_dict, tokenizer_config = groups["tokenizer"], groups["tokenizer_config"]
    if tokenizer_dict.get("tokenizer_type") == "llama":
        tokenizer_config.setdefault("add_bos_token", True)  # llama.cpp's default for sentencepiece
    tokens = tokenizer_dict["tokens"]
    for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding")):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        tokenizer_config[f"{role}_token"] = tokens[token_id] if token_id is not None else None
    backend, extra = convert_gguf_tokenizer(metadata["general.architecture"], tokenizer_dict)
    tokenizer = TokenizersBackend(tokenizer_object=backend, **tokenizer_config, **extra)
    if not tokenizer_config.get("chat_template"):
        _fall_back_to_builtin_template(tokenizer, metadata)
    return tokenizer


def _fall_back_to_builtin_template(tokenizer, metadata: dict[str, Any]) -> None:
    """A file without a chat template gets the built-in one of its family, said in the log."""
    gguf_arch, name = metadata["general.architecture"], metadata.get("general.name", "this GGUF file")
    template = builtin_template(gguf_arch, set(tokenizer.get_vocab()))
    if template is None:
        logger.warning(
            "%s has no chat template and no built-in one fits a %s vocabulary: chat needs --chat-template "
            "FILE|STRING (completions work without)",
            name,
            gguf_arch,
        )
        return
    tokenizer.chat_template = template.source
    logger.warning(
        "%s has no chat template; using the built-in %r template for %s (override with --chat-template FILE|STRING)",
        name,
        template.name,
        gguf_arch,
    )


# the sampling defaults llama.cpp's converter writes from a checkpoint's generation_config.json
# (and llama.cpp samples with unless told otherwise) -> generation_config.json's names
_SAMPLING_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_k": "top_k",
    "general.sampling.top_p": "top_p",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}


def _generation_config(metadata: dict[str, Any], tokenizer):
    """eos ids: the file's eos/eot/eom ids, plus the turn-end token its chat template uses; the
    file's sampling defaults (``_SAMPLING_KEYS``), which ``--generation-config auto`` applies."""
    from transformers import GenerationConfig

    eos_ids: list[int] = []
    for key in ("eos", "eot", "eom"):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and token_id not in eos_ids:
            eos_ids.append(int(token_id))
    template = tokenizer.chat_template or ""
    vocab = tokenizer.get_vocab()
    for token in _TURN_END_TOKENS:
        if token in template and token in vocab and vocab[token] not in eos_ids:
            eos_ids.append(vocab[token])
            break
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    pad = metadata.get("tokenizer.ggml.padding_token_id")
    sampling = {name: metadata[key] for key, name in _SAMPLING_KEYS.items() if key in metadata}
    return GenerationConfig(
        bos_token_id=bos,
        eos_token_id=eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        pad_token_id=pad,
        **({"do_sample": True, **sampling} if sampling else {}),
    )


# ---- weights -----------------------------------------------------------------------------------
def _write_weights(gguf_path: Path, arch, config: dict[str, Any], path: Path, *, progress: bool) -> None:
    """Dequantise tensor by tensor straight into ``model.safetensors``: peak memory is one fp32
    tensor, not the whole model (a 7B GGUF would otherwise need 28 GB)."""
    from ortserve.export.gguf_checkpoint import GgufCheckpoint
    from tqdm.auto import tqdm

    checkpoint = GgufCheckpoint(gguf_path, arch, config)
    names = sorted(checkpoint.names())
    shapes = {name: checkpoint.shape(name) for name in names}
    with open(path, "wb") as out:
        _write_safetensors_header(out, shapes)
        for name in tqdm(names, desc="Dequantising GGUF", unit="tensor", disable=not progress):
            out.write(np.ascontiguousarray(checkpoint.read(name), dtype="<f4").tobytes())


def _write_safetensors_header(out, shapes: dict[str, tuple[int, ...]]) -> None:
    """safetensors layout: u64 header length, JSON header (padded to 8 bytes), then the tensors'
    bytes back to back in header order; here every tensor is F32."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        size = 4 * int(np.prod(shape, dtype=np.int64))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    out.write(struct.pack("<Q", len(encoded)))
    out.write(encoded)
