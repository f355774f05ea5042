"""The exported artifact directory: what export writes and the engine reads (docs/design.md §2).

Layout: ``model.onnx`` (+ ``model.onnx.data``), ``ortserve.json`` (this manifest), the tokenizer
files with the chat template, and ``generation_config.json``.
Graph I/O names: inputs ``input_ids``, ``positions``, ``slot_mapping``, ``block_tables``,
``context_lens``, ``query_start_loc``, ``logits_indices``, ``key_cache.{l}``, ``value_cache.{l}``;
outputs ``logits``, ``key_cache_out.{l}``, ``value_cache_out.{l}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

FORMAT_VERSION = 1
# The custom-op set the installed libortserve_ops.so provides: 1 = PagedAttention,
# 2 = + AppendBlockSums, 3 = + PackedPagedAttention, GatedActivation, 4 = + AddBlockOffsets,
# 5 = + AddBlockOffsets with fp16 offsets, 6 = + MatMulQ4 / MatMulQ8, GatherQ4 / GatherQ8, 7 = + MatMulQ5,
# GatherQ5, 8 = + MatMulF, 9 = + the input stage of MatMulF and MatMulQ (a norm or a gated activation
# inside the linear, contrib_ops/linear_input.h), 10 = + MatMulQ4NL, GatherQ4NL (GGUF's IQ4 codes at 4 bits),
# 11 = + MatMulQ6K, GatherQ6K (GGUF's Q6_K at its own 6.5625 bits a weight), 12 = + MatMulQ4K, MatMulQ5K,
# GatherQ4K, GatherQ5K (GGUF's Q4_K and Q5_K at 4.625 and 5.625 bits a weight, with their sub-scales), 13 = + the
# centred MatMulQ4S, Q5S, Q8S, Q4NLS and their GatherQ (Q4_0, Q5_0, Q8_0 and IQ4 without a stored m per block),
# 14 = + MatMulQ3K, GatherQ3K (GGUF's Q3_K at 3.5625 bits a weight: 3-bit codes, int8 sub-scales per 16 columns),
# 15 = + MatMulQ4XS, GatherQ4XS (GGUF's IQ4_XS at 4.3125 bits a weight: its int8 ls - 32 beside the indices),
# 16 = + MatMulQ2K, GatherQ2K (GGUF's Q2_K at its own 2.625 bits a weight: 2-bit codes, a 4-bit sub-scale and min per
# 16 columns).
# An artifact records the set its graph needs (needed_op_version), so that a new export of a graph
# without the latest ops still loads on an installation one version behind.
OP_VERSION = 16
EXPORT_BASE_OP_VERSION = 9  # every graph this exporter writes: the linears' input stage
OP_ADDED_AFTER_BASE = {
    **{op: 10 for op in ("MatMulQ4NL", "GatherQ4NL")},
    **{op: 11 for op in ("MatMulQ6K", "GatherQ6K")},
    **{op: 12 for op in ("MatMulQ4K", "MatMulQ5K", "GatherQ4K", "GatherQ5K")},
    **{f"{kind}Q{q}S": 13 for kind in ("MatMul", "Gather") for q in ("4", "5", "8", "4NL")},
    **{op: 14 for op in ("MatMulQ3K", "GatherQ3K")},
    **{op: 15 for op in ("MatMulQ4XS", "GatherQ4XS")},
    **{op: 16 for op in ("MatMulQ2K", "GatherQ2K")},
}
MANIFEST = "ortserve.json"
MODEL_FILE = "model.onnx"
# The tokenizer files an artifact copies from its checkpoint, chat template included (whichever exist).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
)
TOKENIZER_SETTINGS = ("tokenizer.json", "tokenizer_config.json")  # a fast tokenizer, or a slow one's settings


def has_tokenizer(folder: str | Path) -> bool:
    """Whether ``folder`` holds a tokenizer to load: one of TOKENIZER_SETTINGS."""
    return any((Path(folder) / name).is_file() for name in TOKENIZER_SETTINGS)


Precision = Literal["fp32", "int8", "int5", "int4"]
ActivationBits = Literal[8, 16]
# Activations of the quantised linears: 16 (int8 codes plus an int8 residual: about 16 bits, answers as
# with float activations; vLLM's w4a16 default) or 8 (int8 blocks, as llama.cpp's Q8_1: faster prefill).
DEFAULT_ACTIVATION_BITS: ActivationBits = 16
KVCacheDtype = Literal["auto", "fp32", "fp16", "int8"]  # auto: kv_cache_row_dtype picks
KV_CACHE_DTYPES: tuple[str, ...] = tuple(d for d in get_args(KVCacheDtype) if d != "auto")  # the row types
# One cached row (one position of one kv head) per KV cache dtype: its numpy type, and how many
# elements follow the head's values (int8: its float32 scale, as 4 bytes). The op's layout:
# contrib_ops/paged_attention_kernel.h CacheRowWidth; graphs from op_version 3 take all three.
KV_ROW: dict[str, tuple[str, int]] = {"fp32": ("float32", 0), "fp16": ("float16", 0), "int8": ("int8", 4)}
COMPACT_KV_OP_VERSION = 3
PRECISIONS: tuple[str, ...] = get_args(Precision)  # the one list: export, resolve, CLIs and benchmarks read it


def needed_op_version(op_types: Iterable[str]) -> int:
    """The op_version a graph of this exporter needs, from the op types of its domain-"ortserve" nodes."""
    return max([EXPORT_BASE_OP_VERSION, *(OP_ADDED_AFTER_BASE.get(op, 0) for op in op_types)])


class ArtifactManifest(BaseModel):
    """``ortserve.json``: the facts the engine needs without opening the graph."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format_version: int = FORMAT_VERSION
    op_version: int = OP_VERSION
    architecture: str = Field(description="Hugging Face model_type, e.g. 'llama'")
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    vocab_size: int
    max_model_len: int
    weight_precision: Precision = Field(description="the fewest bits any linear is stored with")
    lm_head_precision: Precision
    activation_bits: ActivationBits = Field(8, description="activations of the quantised linears: 8 or 16 bits")
    weight_formats: dict[str, int] = Field(
        default_factory=dict, description="how many linear weights are stored how: 'Q4_K (exact)', 'int4', 'fp32'"
    )
    calibration: str = Field(
        "", description="the text the quantiser weighted its error by ('5,432 tokens of built-in text'; '' for none)"
    )
    kv_cache_dtype: Literal["float32"] = "float32"
    num_parameters: int
    weight_bytes: int
    source: str = Field(description="what was exported: a path or a built-in model name")
    source_fingerprint: str = Field(description="sha256 over the source's config and weight files")
    eos_token_ids: list[int] = Field(default_factory=list)

    @staticmethod
    def key_cache_input(layer: int) -> str:
        return f"key_cache.{layer}"

    @staticmethod
    def value_cache_input(layer: int) -> str:
        return f"value_cache.{layer}"

    @staticmethod
    def key_cache_output(layer: int) -> str:
        return f"key_cache_out.{layer}"

    @staticmethod
    def value_cache_output(layer: int) -> str:
        return f"value_cache_out.{layer}"

    @classmethod
    def cache_names(cls, layer: int) -> tuple[str, str, str, str]:
        """The graph's four cache names of one layer: key and value, input and output."""
        return (
            cls.key_cache_input(layer),
            cls.value_cache_input(layer),
            cls.key_cache_output(layer),
            cls.value_cache_output(layer),
        )

    def kv_row_width(self, dtype: str = "fp32") -> int:
        """The caches' last dimension, in elements of ``dtype``."""
        return self.head_size + KV_ROW[dtype][1]

    def kv_bytes_per_token(self, dtype: str = "fp32") -> int:
        """Bytes of K and V for one token across all layers."""
        itemsize = {"float32": 4, "float16": 2, "int8": 1}[KV_ROW[dtype][0]]
        return 2 * self.num_layers * self.num_kv_heads * self.kv_row_width(dtype) * itemsize

    def kv_cache_row_dtype(self, requested: str) -> str:
        """The cache rows for ``--kv-cache-dtype requested``: ``auto`` is fp16 (llama.cpp's default: half
        the memory and bandwidth, the fp32 cache's answers; benchmarks/tables/kv_cache.md) where this
        artifact's graph takes compact caches, else fp32."""
        if requested != "auto":
            return requested
        return "fp16" if self.op_version >= COMPACT_KV_OP_VERSION else "fp32"


@dataclass(frozen=True)
class GraphInput:
    """One per-step input of the exported graph: name, numpy dtype, symbolic dims."""

    name: str
    dtype: str
    dims: tuple[str, ...]


# The graph's per-step inputs (docs/design.md §2), in order; the exporter declares them from this
# table and the model runner binds exactly these. Per layer l there are also key_cache.{l} and
# value_cache.{l} [num_blocks, num_kv_heads, block_size, head_size], bound as both input and output.
STEP_INPUTS: tuple[GraphInput, ...] = (
    GraphInput("input_ids", "int64", ("num_tokens",)),
    GraphInput("positions", "int64", ("num_tokens",)),
    GraphInput("slot_mapping", "int64", ("num_tokens",)),
    GraphInput("block_tables", "int32", ("num_seqs", "max_blocks_per_seq")),
    GraphInput("context_lens", "int32", ("num_seqs",)),
    GraphInput("query_start_loc", "int32", ("num_seqs_plus_1",)),
    GraphInput("logits_indices", "int64", ("num_logits",)),
)
LOGITS_OUTPUT = "logits"  # float32 [num_logits, vocab_size]


class ArtifactError(ValueError):
    """The directory is not a loadable ortserve artifact."""


def is_artifact(path: str | Path) -> bool:
    return (Path(path) / MANIFEST).is_file() and (Path(path) / MODEL_FILE).is_file()


def load_manifest(path: str | Path) -> ArtifactManifest:
    folder = Path(path)
    if not is_artifact(folder):
        raise ArtifactError(
            f"{folder} is not an ortserve artifact (no {MANIFEST} and {MODEL_FILE}). "
            f"Create one with: ortserve export CHECKPOINT -o {folder}"
        )
    manifest = ArtifactManifest.model_validate(json.loads((folder / MANIFEST).read_text()))
    if manifest.format_version != FORMAT_VERSION:
        raise ArtifactError(
            f"{folder} has artifact format {manifest.format_version}; this ortserve reads "
            f"{FORMAT_VERSION}. Re-export it with: ortserve export SRC -o {folder}"
        )
    if manifest.op_version > OP_VERSION:
        raise ArtifactError(
            f"{folder} needs ortserve custom ops version {manifest.op_version}; this installation has "
            f"{OP_VERSION}. Upgrade ortserve, or re-export it with this one: ortserve export SRC -o {folder}"
        )
    return manifest


def save_manifest(path: str | Path, manifest: ArtifactManifest) -> None:
    (Path(path) / MANIFEST).write_text(manifest.model_dump_json(indent=2) + "\n")
