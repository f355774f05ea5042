"""``ortserve export``: Hugging Face checkpoints to paged ONNX artifacts (docs/design.md §2).

Modules, in data-flow order: ``checkpoint`` (safetensors reader), ``config`` + ``architectures`` (what a model is),
``rope`` (rotary tables), ``graph`` (the shared decoder builder), ``qweight`` (MatMulQ weights) + ``kquants``
(GGUF's Q4_K, Q5_K, Q6_K, Q3_K) + ``nbits`` (the container of imported codes), ``weights`` (streaming initializers
to model.onnx.data), ``pipeline`` (stages, temp dir, atomic rename), ``validate`` (run an artifact; compare with
transformers), ``cli``. Nothing here imports torch except ``validate``'s transformers comparison.
"""

from ortserve.artifact import PRECISIONS

from .architectures import ARCHITECTURES, SUPPORTED_MODEL_TYPES, architecture_for
from .errors import ExportError
from .pipeline import export_model

# Bumped whenever the same SRC would export to a different artifact (graph or weights): caches
# of exported artifacts (ortserve.models) key on it.
EXPORTER_VERSION = 5  # 4: fp16 block offsets where exact; 5: 4-bit linears are MatMulQ4

__all__ = [
    "ARCHITECTURES",
    "EXPORTER_VERSION",
    "PRECISIONS",
    "SUPPORTED_MODEL_TYPES",
    "ExportError",
    "architecture_for",
    "export_model",
]
