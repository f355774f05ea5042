"""ortserve: LLM serving on CPU with ONNX Runtime.

``from ortserve import LLM, SamplingParams`` loads them on first use, so ``import ortserve``
stays cheap (no onnxruntime, no transformers).
"""

from pathlib import Path

__version__ = "0.1.0"

# The wheel installs the repository's export/ and models/ as ortserve.export and ortserve.models.
# When this package is imported from a source checkout instead (python run in the repository
# root puts it first on sys.path), let the checkout's folders answer those names the same way.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "export" / "__init__.py").is_file():
    __path__.append(str(_checkout))

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from ortserve.llm import LLM

        return LLM
    if name == "SamplingParams":
        from ortserve.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'ortserve' has no attribute {name!r}")
