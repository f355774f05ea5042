"""ortserve: LLM serving on CPU with ONNX Runtime."""
__version__ = "0.1.0"
