"""The ortserve custom-op library (domain ``ortserve``) and its numpy reference.

The C++ sources live in the repository's ``contrib_ops/``; the build installs the compiled
library and the reference (``paged_attention_reference.py``) into this package.
"""
from __future__ import annotations

from pathlib import Path

DOMAIN = "ortserve"
OPSET_VERSION = 1
_LIBRARY_NAME = "libortserve_ops.so"


def library_path() -> str:
    """Absolute path of the compiled custom-op library shipped inside the package."""
    for folder in __path__:  # editable installs may split the package over two folders
        candidate = Path(folder) / _LIBRARY_NAME
        if candidate.is_file():
            return str(candidate)
    raise FileNotFoundError(
        f"{_LIBRARY_NAME} is not installed next to ortserve.ops ({list(__path__)}). "
        "Build it by reinstalling the package: pip install ."
    )


def register(session_options) -> None:
    """Register the op library on an ``onnxruntime.SessionOptions``."""
    session_options.register_custom_ops_library(library_path())
