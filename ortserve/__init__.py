"""ortserve: LLM serving on CPU with ONNX Runtime.

``from ortserve import LLM, SamplingParams`` loads them on first use, so ``import ortserve``
stays cheap (no onnxruntime, no transformers).
"""
__version__ = "0.1.0"

__all__ = ["LLM", "SamplingParams", "__version__"]


def __getattr__(name: str):
    if name == "LLM":
        from ortserve.llm import LLM

        return LLM
    if name == "SamplingParams":
        from ortserve.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'ortserve' has no attribute {name!r}")
