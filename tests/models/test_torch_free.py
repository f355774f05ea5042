"""Serving's path never needs torch: the first ``ortserve serve`` converts the default model."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Run first in a child interpreter: `import torch` then fails as if torch were not installed.
BLOCK_TORCH = textwrap.dedent(
    """
    import sys
    sys.modules["torch"] = None

    def assert_torch_never_loaded():
        loaded = sorted(m for m, mod in sys.modules.items() if m.split(".")[0] == "torch" and mod is not None)
        assert not loaded, f"torch modules were loaded: {loaded}"
    """
)


def run_without_torch(code: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, ORTSERVE_CACHE_DIR=str(cache))
    script = BLOCK_TORCH + textwrap.dedent(code) + "\nassert_torch_never_loaded()\n"
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_torch_is_really_blocked(tmp_path: Path):
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_TORCH + "import torch"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "ModuleNotFoundError" in result.stderr


@pytest.mark.slow
def test_gguf_conversion_runs_without_torch(tmp_path: Path, smollm2_checkpoint: Path):
    run_without_torch(
        """
        from ortserve.models import prepare_checkpoint
        print(prepare_checkpoint("smollm2-135m-instruct", progress=False))
        """,
        tmp_path / "cache",
    )
    converted = tmp_path / "cache" / "checkpoints" / "smollm2-135m-instruct"
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (converted / name).read_bytes() == (smollm2_checkpoint / name).read_bytes(), name
