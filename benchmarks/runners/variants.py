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
- llama.cpp's IQ4_XS, Q4_K_M, Q3_K_M and Q2_K files of the model (llama-quantize from f32, no importance
  matrix), each served by llama.cpp and by ortserve (its codes imported exactly: MatMulQ4NLS; MatMulQ4K / Q5K / Q6K
  for Q4_K_M's mix, MatMulQ3K too for Q3_K_M's, MatMulQ2K for Q2_K's; a width not a multiple of 256 takes
  llama-quantize's fallback type, IQ4_NL for Q3_K, so Q3_K and Q2_K need a model such as the Qwen2.5-1.5B shape).
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


class LlamaCppFile(Variant):
    """llama.cpp on its own llama-quantize file of FILE_TYPE (from f32, no importance matrix)."""

    FILE_TYPE: str
    BASE = llamacpp
    PRECISIONS = ("int4",)
    WORKLOADS_SUPPORTED = ("decode", "prefill", "serve-c16")

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        return llamacpp.run(model, precision, workloads, cls.SYSTEM, gguf_type=cls.FILE_TYPE)

    @classmethod
    def weights(cls, model_name: str, precision: str) -> Path:
        return llamacpp.gguf_path(model_name, cls.FILE_TYPE)


class OrtserveFile(Variant):
    """ortserve serving that same file (its codes imported exactly)."""

    FILE_TYPE: str
    PRECISIONS = ("int4",)
    WORKLOADS_SUPPORTED = ("decode", "prefill", "serve-c16")

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        source = llamacpp.gguf(model, precision, cls.FILE_TYPE)
        return ortserve_runner.run(model, precision, workloads, cls.SYSTEM, source=source)

    @classmethod
    def weights(cls, model_name: str, precision: str) -> Path:
        source = llamacpp.gguf_path(model_name, cls.FILE_TYPE)
        return ortserve_runner.artifact_path(model_name, precision, f"-from-{source.stem}") / "model.onnx"


class LlamaCppIq4Xs(LlamaCppFile):
    SYSTEM, FILE_TYPE = "llama.cpp-iq4xs", "iq4_xs"


class OrtserveIq4Xs(OrtserveFile):
    SYSTEM, FILE_TYPE = "ortserve-iq4xs", "iq4_xs"


class LlamaCppQ4KM(LlamaCppFile):
    SYSTEM, FILE_TYPE = "llama.cpp-q4km", "q4_k_m"


class OrtserveQ4KM(OrtserveFile):
    SYSTEM, FILE_TYPE = "ortserve-q4km", "q4_k_m"


class LlamaCppQ3KM(LlamaCppFile):
    SYSTEM, FILE_TYPE = "llama.cpp-q3km", "q3_k_m"


class OrtserveQ3KM(OrtserveFile):
    SYSTEM, FILE_TYPE = "ortserve-q3km", "q3_k_m"


class LlamaCppQ2K(LlamaCppFile):
    SYSTEM, FILE_TYPE = "llama.cpp-q2k", "q2_k"


class OrtserveQ2K(OrtserveFile):
    SYSTEM, FILE_TYPE = "ortserve-q2k", "q2_k"


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
    LlamaCppQ4KM,
    OrtserveQ4KM,
    LlamaCppQ3KM,
    OrtserveQ3KM,
    LlamaCppQ2K,
    OrtserveQ2K,
)
