"""Engine configuration: one pydantic model, and the command-line flags generated from it.

`ortserve serve` and `ortserve generate` both call ``add_engine_arguments(parser)`` and
``EngineConfig.from_args(args)``; the flags come from the fields (as vLLM's ``EngineArgs``), so
an option is written once.

Defaults were picked from measurements on the 2-core AVX-512 machine with SmolLM2-135M
(see benchmarks/bench_offline.py and the numbers quoted next to each default).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ortserve.artifact import DEFAULT_ACTIVATION_BITS, ActivationBits, KVCacheDtype, Precision
from ortserve.tokenizer import read_chat_template

KVCACHE_SPACE_ENV = "ORTSERVE_KVCACHE_SPACE"
THREADS_BIND_ENV = "ORTSERVE_THREADS_BIND"

# Measured on the 2-core AVX-512 machine with SmolLM2-135M fp32 by
# `python benchmarks/bench_offline.py --defaults` (best of 12 steps, 200-token contexts):
# Block size 16: a 32-sequence decode step took 45.4 ms with 16-token blocks, 46.4 ms with 8 and
# 47.2 ms with 32; 16 also wastes less memory at each sequence's tail than 32.
DEFAULT_BLOCK_SIZE = 16
# Sequence cap 32: decode steps of 1 / 8 / 16 / 32 / 64 sequences took 13.7 / 23.6 / 30.3 / 45.4 /
# 74.4 ms (73 / 339 / 528 / 705 / 861 tokens/s). Past 32, throughput gains 22% while every stream
# slows by 64%; at 32 each stream still gets about 20 tokens/s.
DEFAULT_MAX_NUM_SEQS = 32
# Token budget 256: one prefill chunk of 32 / 64 / 128 / 256 / 512 / 1024 tokens ran at
# 1040 / 1370 / 1590 / 1670 / 1650 / 1560 tokens/s. 256 reaches the peak; larger chunks only make
# the running decodes wait longer (a 256-token chunk takes about 150 ms).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 256
# Draft-model speculation only up to 4 decoding sequences a step: SmolLM2-135M fp32 with its int4
# artifact as draft, served, 128/128 random prompts, output tok/s against no speculation: 1 at a
# time 57.7 vs 34.5, 4 at a time 105.6 vs 99.1, 16 at a time 163.6 vs 216.7.
DRAFT_MODEL_MAX_BATCH = 4
# KV space when neither the flag nor the env var is set: 4 GiB like vLLM's CPU backend, lowered
# at start-up to what fits next to the weights (the memory check in engine/memory.py).
DEFAULT_KV_CACHE_SPACE_GIB = 4.0


def _env_float(name: str) -> float | None:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else None


class EngineConfig(BaseModel):
    """The engine's options. The command-line flags are generated from these fields
    (``add_engine_arguments``), so an option is added once, here."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str | None = Field(
        None,
        description="artifact directory, Hugging Face checkpoint directory, .gguf file or built-in model "
        "name (default: the embedded SmolLM2); anything but an artifact is exported on first use and cached",
    )
    precision: Precision | None = Field(
        None,
        description="weight precision when MODEL is not an artifact (default: the source's own -- fp32 for a "
        "checkpoint, a GGUF file's quantised codes, a built-in model's default)",
    )
    activation_bits: ActivationBits = Field(
        DEFAULT_ACTIVATION_BITS,
        description="activations of the quantised linears when MODEL is not an artifact: 16 (int8 plus an int8 "
        "residual, answers as with float activations) or 8 (int8 blocks as llama.cpp's: about 1.7x the prefill "
        "speed, some answers differ)",
    )
    chat_template: str | None = Field(
        None,
        description="a chat template (a file, or the Jinja text itself) replacing the model's; needed for chat "
        "when the model has none",
        json_schema_extra={"metavar": "FILE|STRING"},
    )
    block_size: int = Field(DEFAULT_BLOCK_SIZE, ge=1, le=256, description="tokens per KV block")
    kv_cache_space: float | None = Field(
        default_factory=lambda: _env_float(KVCACHE_SPACE_ENV),
        gt=0,
        description=f"KV cache size in GiB (env {KVCACHE_SPACE_ENV}; default "
        f"{DEFAULT_KV_CACHE_SPACE_GIB:g} or what fits in memory)",
        json_schema_extra={"metavar": "GiB"},
    )
    kv_cache_dtype: KVCacheDtype = Field(
        "auto",
        description="KV cache element type: fp32, fp16 (half the memory and bandwidth) or int8 (about a "
        "quarter; one scale per row); auto is fp16 where the artifact takes compact caches (op_version 3 "
        "or later), else fp32",
    )
    max_num_seqs: int = Field(DEFAULT_MAX_NUM_SEQS, ge=1, description="most sequences in one step")
    speculative: Literal["off", "ngram", "draft"] = Field(
        "off",
        description="speculative decoding: 'ngram' drafts tokens by prompt lookup (the sequence's tail "
        "found earlier in its own text), 'draft' by a smaller model (--draft-model); the model checks "
        "them in one step: the same output under greedy sampling, the same distribution otherwise",
    )
    draft_model: str | None = Field(
        None,
        description="the draft model of --speculative draft (implies it): an artifact, checkpoint, .gguf or "
        "built-in name with MODEL's vocabulary, e.g. MODEL itself at --draft-precision int4",
    )
    draft_precision: Precision | None = Field(
        None, description="weight precision of --draft-model when it is not an artifact (default: the source's own)"
    )
    num_speculative_tokens: int = Field(4, ge=1, le=16, description="most draft tokens per sequence and step")
    speculative_disable_by_batch_size: int | None = Field(
        None,
        ge=1,
        description="no drafts in a step with more decoding sequences than this (default: "
        f"{DRAFT_MODEL_MAX_BATCH} with --speculative draft, whose drafts cost k runs of the draft model; "
        "no limit with ngram)",
    )
    ngram_min: int = Field(1, ge=1, le=16, description="shortest tail that prompt lookup matches")
    ngram_max: int = Field(4, ge=1, le=16, description="longest tail that prompt lookup matches")
    max_num_batched_tokens: int = Field(DEFAULT_MAX_NUM_BATCHED_TOKENS, ge=1, description="most tokens in one step")
    max_model_len: int | None = Field(
        None, ge=1, description="longest prompt + output in tokens (default: the model's, capped by the KV cache)"
    )
    threads_bind: str = Field(
        default_factory=lambda: os.environ.get(THREADS_BIND_ENV) or "auto",
        description=f"cores for the engine: a CPU list like 0-3, 'auto' or 'nobind' "
        f"(env {THREADS_BIND_ENV}; default auto)",
    )
    reserved_cpus: int = Field(0, ge=0, description="with --threads-bind auto, leave this many cores to other work")
    threads: int | None = Field(
        None,
        ge=1,
        description="how many cores (threads) the engine uses: the first N that --threads-bind auto "
        "or nobind picks (default: all of them)",
    )
    generation_config: Literal["auto", "vllm"] = Field(
        "auto",
        description="request defaults: 'auto' takes temperature, top_p, top_k, min_p, repetition_penalty and "
        "max_new_tokens from the model's generation_config.json where a request leaves them out (as vLLM "
        "does); 'vllm' ignores the file",
    )
    stream_interval: int = Field(
        1,
        ge=1,
        le=1024,
        description="send a request's new tokens every N tokens (its first token at once, its end at once): "
        "fewer, larger stream chunks cost the server and its clients less CPU per token (vLLM's flag)",
    )
    enable_prefix_caching: bool = Field(
        True, description="disable prefix caching", json_schema_extra={"flag": "--no-prefix-caching"}
    )

    @model_validator(mode="after")
    def _draft_model_given(self) -> EngineConfig:
        """--draft-model implies --speculative draft; --speculative draft needs it."""
        if self.draft_model is not None and self.speculative == "off":
            self.speculative = "draft"
        if self.speculative == "draft" and self.draft_model is None:
            raise ValueError("--speculative draft needs --draft-model MODEL (a smaller model with the same vocabulary)")
        if self.speculative == "ngram" and self.draft_model is not None:
            raise ValueError("--draft-model goes with --speculative draft, not ngram; drop one of them")
        return self

    @property
    def max_drafting_seqs(self) -> int | None:
        """The most decoding sequences a step drafts for (None: no limit)."""
        if self.speculative_disable_by_batch_size is not None:
            return self.speculative_disable_by_batch_size
        return DRAFT_MODEL_MAX_BATCH if self.speculative == "draft" else None

    @field_validator("chat_template")
    @classmethod
    def _template_readable(cls, value: str | None) -> str | None:
        """A --chat-template that is neither a file nor Jinja fails at start, not at the first chat."""
        if value is not None:
            read_chat_template(value)
        return value

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineConfig:
        """The config of the flags in ``args``; a ValueError names each bad flag and its value."""
        values = {name: getattr(args, name) for name in cls.model_fields if getattr(args, name, None) is not None}
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ValueError("; ".join(_flag_error(error) for error in exc.errors())) from None


def add_engine_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """One flag per EngineConfig field. Every default is None so that ``from_args`` leaves the
    field's default (and its environment variable) in charge when a flag is not given."""
    group = parser.add_argument_group("engine")
    for name, info in EngineConfig.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        flag = _flag(name)
        default = info.get_default(call_default_factory=False)
        help_text = info.description or ""
        if info.annotation is bool:  # a flag that turns a default-on option off
            group.add_argument(flag, dest=name, action="store_false", default=None, help=help_text)
            continue
        kind, choices = _scalar_type(info.annotation)
        if default is not None and info.default_factory is None:
            help_text += f" (default {default})"
        group.add_argument(
            flag,
            dest=name,
            type=kind,
            choices=choices,
            default=None,
            metavar=str(extra["metavar"]) if "metavar" in extra else None,
            help=help_text,
        )
    return parser


def engine_flags(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> list[str]:
    """The flags that give another process (a cluster replica's server) the engine options set in
    ``args``: the inverse of ``add_engine_arguments``."""
    flags: list[str] = []
    for name, info in EngineConfig.model_fields.items():
        value = getattr(args, name, None)
        if value is None or name in skip:
            continue
        if info.annotation is bool:
            flags += [] if value else [_flag(name)]  # only the flag that turns a default-on option off
        else:
            flags += [_flag(name), str(value)]
    return flags


def _flag_error(error: Any) -> str:
    """One pydantic error as the command line spells it: '--block-size 0: input should be ...'."""
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:  # a rule between flags: its message names them
        return message
    return f"{_flag(str(error['loc'][0]))} {error['input']}: {message[0].lower()}{message[1:]}"


def _flag(name: str) -> str:
    extra = EngineConfig.model_fields[name].json_schema_extra
    return str((extra.get("flag") if isinstance(extra, dict) else None) or "--" + name.replace("_", "-"))


def _scalar_type(annotation: object) -> tuple[type, list[str] | list[int] | None]:
    args = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        values = get_args(annotation)
        if all(isinstance(v, int) for v in values):  # e.g. --activation-bits 8|16
            return int, list(values)
        return str, [str(a) for a in values]
    if args:
        return _scalar_type(args[0])
    return (annotation if isinstance(annotation, type) else str), None
