"""Systems that are a plain runner with flags added, under their own row label:

- speculative decoding beside each other: ortserve's prompt lookup (``--speculative ngram``) and
  llama.cpp's own n-gram mode (``--spec-type ngram-simple``, its defaults), on the input-grounded
  workload where the output repeats the prompt and on random prompts where it does not; and a draft
  model, the same checkpoint at int4 drafting for its fp32 self (ortserve ``--draft-model`` with
  its int4 artifact, llama.cpp ``--model-draft`` with its Q4_0 file, each with its default number
  of draft tokens: 4 and 3);
- ortserve with each KV cache row type (``--kv-cache-dtype fp32|fp16|int8``; plain ortserve has
  ``auto``, fp16 since 2026-12-04, fp32 before), on the workloads where attention matters (decode,
  many sequences, shared prefixes);
- ortserve with int8 activations in its quantised linears (``--activation-bits 8``, exported so):
  the same activation rounding as llama.cpp's, against ortserve's default of 16 bits;
- llama.cpp's IQ4_XS file of the model (llama-quantize from f32, no importance matrix), served by
  llama.cpp and by ortserve (its codes imported exactly, MatMulQ4NL).
"""

from __future__ import annotations

from pathlib import Path

from runners import llamacpp, ortserve_runner
from runners.common import Model


class Variant:
    SYSTEM: str
    BASE = ortserve_runner
    FLAGS: tuple[str, ...] = ()
    PRECISIONS: tuple[str, ...] = ortserve_runner.PRECISIONS
    WORKLOADS_SUPPORTED: tuple[str, ...] = ()

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        return cls.BASE.run(model, precision, workloads, cls.SYSTEM, cls.FLAGS)


class OrtserveNgram(Variant):
    SYSTEM = "ortserve-ngram"
    FLAGS = ("--speculative", "ngram")
    WORKLOADS_SUPPORTED = ("decode", "grounded")


class LlamaCppNgram(Variant):
    SYSTEM = "llama.cpp-ngram"
    BASE = llamacpp
    FLAGS = ("--spec-type", "ngram-simple")
    PRECISIONS = llamacpp.PRECISIONS
    WORKLOADS_SUPPORTED = ("decode", "grounded")


class OrtserveDraft(Variant):
    SYSTEM = "ortserve-draft"
    PRECISIONS = ("fp32",)
    WORKLOADS_SUPPORTED = ("decode", "grounded")

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        draft = ortserve_runner.artifact(model, "int4")
        return ortserve_runner.run(model, precision, workloads, cls.SYSTEM, ("--draft-model", str(draft)))


class LlamaCppDraft(Variant):
    SYSTEM = "llama.cpp-draft"
    BASE = llamacpp
    PRECISIONS = ("fp32",)
    WORKLOADS_SUPPORTED = ("decode", "grounded")

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        draft = llamacpp.gguf(model, "int4")
        flags = ("--spec-type", "draft-simple", "--model-draft", str(draft))
        return llamacpp.run(model, precision, workloads, cls.SYSTEM, flags)


class OrtserveKvFp32(Variant):
    SYSTEM = "ortserve-kv-fp32"
    FLAGS = ("--kv-cache-dtype", "fp32")
    WORKLOADS_SUPPORTED = ("decode", "serve-c16", "shared-prefix")


class OrtserveKvFp16(Variant):
    SYSTEM = "ortserve-kv-fp16"
    FLAGS = ("--kv-cache-dtype", "fp16")
    WORKLOADS_SUPPORTED = ("decode", "serve-c16", "shared-prefix")


class OrtserveKvInt8(Variant):
    SYSTEM = "ortserve-kv-int8"
    FLAGS = ("--kv-cache-dtype", "int8")
    WORKLOADS_SUPPORTED = ("decode", "serve-c16", "shared-prefix")


class OrtserveA8(Variant):
    SYSTEM = "ortserve-a8"
    PRECISIONS = ("int4",)
    WORKLOADS_SUPPORTED = ("decode", "prefill", "serve-c16", "grounded")

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        return ortserve_runner.run(model, precision, workloads, cls.SYSTEM, export_flags=("--activation-bits", "8"))


class LlamaCppIq4Xs(Variant):
    SYSTEM = "llama.cpp-iq4xs"
    BASE = llamacpp
    PRECISIONS = ("int4",)
    WORKLOADS_SUPPORTED = ("decode", "prefill", "serve-c16")

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        return llamacpp.run(model, precision, workloads, cls.SYSTEM, gguf_type="iq4_xs")

    @staticmethod
    def weights(model_name: str, precision: str) -> Path:
        return llamacpp.gguf_path(model_name, "iq4_xs")


class OrtserveIq4Xs(Variant):
    SYSTEM = "ortserve-iq4xs"
    PRECISIONS = ("int4",)
    WORKLOADS_SUPPORTED = ("decode", "prefill", "serve-c16")

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        source = llamacpp.gguf(model, precision, "iq4_xs")
        return ortserve_runner.run(model, precision, workloads, cls.SYSTEM, source=source)

    @staticmethod
    def weights(model_name: str, precision: str) -> Path:
        source = llamacpp.gguf_path(model_name, "iq4_xs")
        return ortserve_runner.artifact_path(model_name, precision, f"-from-{source.stem}") / "model.onnx"


VARIANTS = (
    OrtserveNgram,
    LlamaCppNgram,
    OrtserveDraft,
    LlamaCppDraft,
    OrtserveKvFp32,
    OrtserveKvFp16,
    OrtserveKvInt8,
    OrtserveA8,
    LlamaCppIq4Xs,
    OrtserveIq4Xs,
)
