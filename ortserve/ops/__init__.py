"""The ortserve custom-op library (domain ``ortserve``) and its numpy reference.

The C++ sources live in the repository's ``contrib_ops/``; the build installs the compiled
library and the references (``paged_attention_reference.py``, ``matmul_q_reference.py``) into this package.
"""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

DOMAIN = "ortserve"
OPSET_VERSION = 1
# The head sizes PagedAttention computes (contrib_ops/paged_attention.cc refuses others at run
# time); export refuses a model outside them at once.
MIN_HEAD_SIZE, MAX_HEAD_SIZE = 32, 256
_LIBRARY_NAME = "libortserve_ops.so"


# In a source checkout the reference sits in contrib_ops/ rather than beside this file.
_checkout_ops = Path(__file__).resolve().parents[2] / "contrib_ops"
if (_checkout_ops / "paged_attention_reference.py").is_file():
    __path__.append(str(_checkout_ops))


def _installed_copy() -> Path | None:
    """The library in the installed distribution, for a source checkout that shadows it."""
    try:
        return Path(metadata.distribution("ortserve").locate_file(f"ortserve/ops/{_LIBRARY_NAME}"))
    except metadata.PackageNotFoundError:
        return None


def library_path() -> str:
    """Absolute path of the compiled custom-op library shipped inside the package."""
    # Editable installs may split the package over two folders; a checkout defers to the install.
    candidates = [Path(folder) / _LIBRARY_NAME for folder in __path__] + [_installed_copy()]
    for candidate in candidates:
        if candidate is not None and candidate.is_file():
            return str(candidate.resolve())
    raise FileNotFoundError(
        f"{_LIBRARY_NAME} is not installed next to ortserve.ops ({list(__path__)}). "
        "Build it by reinstalling the package: pip install ."
    )


def register(session_options) -> None:
    """Register the op library on an ``onnxruntime.SessionOptions``."""
    session_options.register_custom_ops_library(library_path())
