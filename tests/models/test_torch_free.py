"""Serving's path never needs torch: the first ``ortserve serve`` converts the default model."""

from __future__ import annotations

import json
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

    def peak_rss() -> int:  # VmHWM: this process's own peak (ru_maxrss keeps the forking parent's)
        with open("/proc/self/status") as status:
            kib = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
        return int(kib) * 1024

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
def test_gguf_conversion_runs_without_torch(tmp_path: Path, smollm2_checkpoint: Path, report_figure):
    result = run_without_torch(
        """
        import json, time
        started = time.perf_counter()
        from ortserve.models import prepare_checkpoint
        prepare_checkpoint("smollm2-135m-instruct", progress=False)
        print(json.dumps({"seconds": time.perf_counter() - started, "peak_rss": peak_rss()}))
        """,
        tmp_path / "cache",
    )
    cost = json.loads(result.stdout.strip().splitlines()[-1])
    report_figure(
        f"SmolLM2 GGUF -> HF conversion without torch: {cost['seconds']:.1f} s, "
        f"peak RSS {cost['peak_rss'] / 2**20:.0f} MiB"
    )
    converted = tmp_path / "cache" / "checkpoints" / "smollm2-135m-instruct"
    for name in ("model.safetensors", "tokenizer.json", "config.json", "generation_config.json"):
        assert (converted / name).read_bytes() == (smollm2_checkpoint / name).read_bytes(), name


@pytest.mark.slow
def test_first_serve_resolves_the_default_model_without_torch(tmp_path: Path, report_figure):
    """What the first ``ortserve serve`` does from a cold cache: convert the GGUF's metadata, then
    export it with its own Q4_1 codes (the embedded default)."""
    result = run_without_torch(
        """
        import json, time
        started = time.perf_counter()
        from ortserve.artifact import load_manifest
        from ortserve.models import resolve_model
        artifact = resolve_model(None, progress=False)
        manifest = load_manifest(artifact)
        print(json.dumps({"seconds": time.perf_counter() - started, "artifact": str(artifact),
                          "precision": manifest.weight_precision, "layers": manifest.num_layers,
                          "formats": manifest.weight_formats}))
        """,
        tmp_path / "cache",
    )
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["artifact"] == str(tmp_path / "cache" / "artifacts" / "smollm2-135m-instruct-native-a16")
    assert (outcome["precision"], outcome["layers"]) == ("int4", 30)
    assert outcome["formats"] == {"Q4_1 (exact)": 210, "Q8_0 (exact)": 1}
    report_figure(
        f"first serve from a cold cache (convert + export of the Q4_1 codes), no torch: {outcome['seconds']:.1f} s"
    )
