"""Server fixtures: real server processes on 127.0.0.1, each on a free port.

- ``server``: ``ortserve serve`` on the real SmolLM2 artifact, shared by the whole folder, with
  an API key; stopped with SIGTERM at the end (and must exit 0).
- ``fake_server``: the same server around the FakeCore (fake_engine.py), for HTTP behaviour
  that needs no model.
- ``tiny_server``: ``ortserve serve`` on the tiny random Llama (SmolLM2's tokenizer and ChatML
  template), shared by the whole session, trusting request chat templates: for the agent API
  (structured outputs, tools, prompt logprobs, the Responses API), where a grammar, not the
  model, decides what is valid.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # server_process, fake_engine

from server_process import ServerProcess

API_KEY = "sk-ortserve-test"
SERVED_NAME = "smollm2-135m-instruct"
MAX_MODEL_LEN = 1024
MAX_BODY = 1 << 20


@pytest.fixture(scope="session")
def server(smollm2_artifact: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess.real(
        smollm2_artifact,
        "--served-model-name",
        SERVED_NAME,
        "--api-key",
        API_KEY,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-request-body-bytes",
        str(MAX_BODY),
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
    assert code == 0, f"SIGTERM must exit 0, got {code}:\n{proc.output[-3000:]}"


@pytest.fixture(scope="module")
def fake_server(tokenizer_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess.fake(tokenizer_dir, "--api-key", API_KEY, "--max-request-body-bytes", str(MAX_BODY))
    try:
        proc.wait_ready(60)
        yield proc
    finally:
        proc.stop(30)


TINY_NAME = "tiny"


def serve_tiny(artifact: Path, *flags: str) -> Iterator[ServerProcess]:
    """``ortserve serve`` on the tiny Llama with ``flags``, for a fixture to yield from; it must
    exit 0 on SIGTERM."""
    proc = ServerProcess.real(
        artifact,
        "--served-model-name",
        TINY_NAME,
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--kv-cache-space",
        "0.05",
        "--threads-bind",
        "nobind",
        *flags,
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        code = proc.stop()
    assert code == 0, f"SIGTERM must exit 0, got {code}:\n{proc.output[-3000:]}"


@pytest.fixture(scope="session")
def tiny_server(tiny_llama_artifact: Path) -> Iterator[ServerProcess]:
    yield from serve_tiny(tiny_llama_artifact, "--trust-request-chat-template")
