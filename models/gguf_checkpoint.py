"""GGUF file -> Hugging Face checkpoint directory, without torch.

Serving must never need torch, and the default model is converted on the first ``ortserve
serve``, so this does by hand what ``AutoModelForCausalLM.from_pretrained(d, gguf_file=f)``
does with torch: gguf's numpy reader and dequantiser for the weights, transformers' own GGUF
tables (torch-free modules) for the config and the tokenizer. The tests check that the result
equals transformers' loading tensor by tensor, and that it runs with torch unimportable.

Output: ``config.json``, ``model.safetensors`` (fp32), ``tokenizer.json``,
``tokenizer_config.json``, ``chat_template.jinja``, ``generation_config.json``.
"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .registry import ModelSourceError

logger = logging.getLogger(__name__)

# Bump when the output changes: cached conversions with another version are redone.
CONVERTER_VERSION = 1


@dataclass(frozen=True)
class GgufArchitecture:
    """How one llama.cpp architecture maps back onto a transformers model."""

    model_type: str
    hf_architecture: str
    global_modules: tuple[str, ...]
    layer_modules: tuple[str, ...]  # under ``model.layers.{i}.``
    permute_qk: bool  # llama.cpp interleaves the rotary halves of each Q and K head


_LLAMA_LAYER = (
    "input_layernorm",
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "post_attention_layernorm",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
_LLAMA_GLOBAL = ("model.embed_tokens", "model.norm", "lm_head")

# GGUF ``general.architecture`` -> what it becomes. llama.cpp also files Mistral under "llama".
GGUF_ARCHITECTURES = {
    "llama": GgufArchitecture("llama", "LlamaForCausalLM", _LLAMA_GLOBAL, _LLAMA_LAYER, permute_qk=True),
}
_MISTRAL = GgufArchitecture("mistral", "MistralForCausalLM", _LLAMA_GLOBAL, _LLAMA_LAYER, permute_qk=True)

# Tokens that end a chat turn in common templates: a stop token when the template uses it.
_TURN_END_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")


def convert_gguf(gguf_path: Path, out_dir: Path, *, progress: bool = True) -> None:
    """Write the HF checkpoint of ``gguf_path`` into the existing, empty ``out_dir``."""
    import gguf

    try:
        reader = gguf.GGUFReader(gguf_path, "r")
    except Exception as exc:  # the reader raises bare ValueErrors/struct errors on bad files
        raise ModelSourceError(f"{gguf_path} is not a readable GGUF file: {exc}") from exc
    metadata = {key: field.contents() for key, field in reader.fields.items()}
    tensor_names = [tensor.name for tensor in reader.tensors]
    arch = _architecture(metadata, gguf_path)

    config = _config(metadata, tensor_names, arch)
    config.save_pretrained(out_dir)
    tokenizer = _tokenizer(metadata)
    tokenizer.save_pretrained(out_dir)
    _generation_config(metadata, tokenizer).save_pretrained(out_dir)
    _write_weights(reader, config, arch, out_dir / "model.safetensors", progress=progress)


def _architecture(metadata: dict[str, Any], gguf_path: Path) -> GgufArchitecture:
    name = metadata.get("general.architecture")
    if name not in GGUF_ARCHITECTURES:
        raise ModelSourceError(
            f"{gguf_path} holds a {name!r} model; GGUF conversion supports: "
            f"{', '.join(sorted(GGUF_ARCHITECTURES))}. Convert the model to a Hugging Face "
            "checkpoint another way and run: ortserve export CHECKPOINT_DIR -o OUT"
        )
    # transformers' rule: a "llama" file whose name says mistral is a Mistral.
    if name == "llama" and "mistral" in str(metadata.get("general.name", "")).lower():
        return _MISTRAL
    return GGUF_ARCHITECTURES[name]


def _config(metadata: dict[str, Any], tensor_names: list[str], arch: GgufArchitecture):
    """The transformers config, read through transformers' own GGUF key table."""
    from transformers import AutoConfig
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

    gguf_arch = metadata["general.architecture"]
    values: dict[str, Any] = {}
    for key, value in metadata.items():
        prefix, _, rest = key.partition(".")
        table = GGUF_CONFIG_MAPPING.get(arch.model_type if prefix == gguf_arch else prefix, {})
        target = table.get(rest)
        if target in (None, -1) or key == "general.name":
            continue
        values[target] = value
    values["model_type"] = arch.model_type
    values["tie_word_embeddings"] = "output.weight" not in tensor_names
    values.setdefault("vocab_size", len(metadata["tokenizer.ggml.tokens"]))
    config = AutoConfig.for_model(**values)
    config.architectures = [arch.hf_architecture]
    config.dtype = "float32"
    return config


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
    return TokenizersBackend(tokenizer_object=backend, **tokenizer_config, **extra)


def _generation_config(metadata: dict[str, Any], tokenizer):
    """eos ids: the file's eos/eot/eom ids, plus the turn-end token its chat template uses."""
    from transformers import GenerationConfig

    eos_ids: list[int] = []
    for key in ("eos", "eot", "eom"):
        token_id = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if token_id is not None and token_id not in eos_ids:
            eos_ids.append(int(token_id))
    template = metadata.get("tokenizer.chat_template") or ""
    vocab = tokenizer.get_vocab()
    for token in _TURN_END_TOKENS:
        if token in template and token in vocab and vocab[token] not in eos_ids:
            eos_ids.append(vocab[token])
            break
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    pad = metadata.get("tokenizer.ggml.padding_token_id")
    return GenerationConfig(
        bos_token_id=bos,
        eos_token_id=eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        pad_token_id=pad,
    )


def _hf_names(arch: GgufArchitecture, gguf_arch: str, num_layers: int) -> dict[str, str]:
    """GGUF tensor name -> HF parameter name, through gguf's own name table (as transformers does)."""
    import gguf

    arch_ids = [key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == gguf_arch]
    table = gguf.get_tensor_name_map(arch_ids[0], num_layers)
    modules = list(arch.global_modules)
    modules += [f"model.layers.{i}.{module}" for i in range(num_layers) for module in arch.layer_modules]
    names = {}
    for module in modules:
        base = table.get_name(module)
        if base is not None:
            for suffix in (".weight", ".bias"):
                names[base + suffix] = module + suffix
    return names


def _unpermute_qk(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's rotary row order: per head it stores the rows as (half, pair) where HF
    stores (pair, half), i.e. interleaved pairs instead of two rotate-half blocks."""
    rows, cols = weight.shape
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _write_weights(reader, config, arch: GgufArchitecture, path: Path, *, progress: bool) -> None:
    """Dequantise tensor by tensor straight into ``model.safetensors``: peak memory is one fp32
    tensor, not the whole model (a 7B GGUF would otherwise need 28 GB)."""
    from tqdm.auto import tqdm

    hf_names = _hf_names(arch, reader.fields["general.architecture"].contents(), config.num_hidden_layers)
    kept = [(hf_names[t.name], t) for t in reader.tensors if t.name in hf_names]
    skipped = [t.name for t in reader.tensors if t.name not in hf_names]
    if skipped:
        logger.info("GGUF tensors with no transformers counterpart were left out: %s", skipped)
    required = {name for name in hf_names.values() if name.endswith(".weight")}
    if config.tie_word_embeddings:
        required.discard("lm_head.weight")
    missing = sorted(required - {name for name, _ in kept})
    if missing:
        raise ModelSourceError(f"The GGUF file lacks {len(missing)} weights the model needs, e.g. {missing[:3]}")

    kept.sort(key=lambda item: item[0])
    shapes = {name: tuple(int(n) for n in reversed(tensor.shape)) for name, tensor in kept}
    with open(path, "wb") as out:
        _write_safetensors_header(out, shapes)
        for name, tensor in tqdm(kept, desc="Dequantising GGUF", unit="tensor", disable=not progress):
            weight = _dequantise(tensor, name, config, arch)
            if weight.shape != shapes[name]:
                raise ModelSourceError(
                    f"GGUF tensor {tensor.name} dequantised to {weight.shape}, expected {shapes[name]}"
                )
            out.write(np.ascontiguousarray(weight, dtype="<f4").tobytes())


def _dequantise(tensor, name: str, config, arch: GgufArchitecture) -> np.ndarray:
    import gguf

    weight = gguf.dequantize(tensor.data, tensor.tensor_type).astype(np.float32, copy=False)
    if arch.permute_qk and name.endswith("self_attn.q_proj.weight"):
        return _unpermute_qk(weight, config.num_attention_heads)
    if arch.permute_qk and name.endswith("self_attn.k_proj.weight"):
        return _unpermute_qk(weight, config.num_key_value_heads)
    return weight


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
