"""The model's generation_config.json gives the defaults of the fields a request leaves out (vLLM's
--generation-config auto), through the official openai client: the tiny Llama with top_k 1 and
max_new_tokens 5 in its generation_config.json decodes greedily and stops at 5 tokens unless the
request says otherwise; offline, LLM.get_default_sampling_params() has the same values, and
generation_config="vllm" ignores the file."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from conftest import TINY_NAME, serve_tiny
from server_process import ServerProcess

from ortserve import LLM

PROMPT = "The quick brown fox jumps over the lazy dog"


def with_generation_config(tiny: Path, folder: Path, **fields: float) -> Path:
    """A copy of the tiny Llama whose generation_config.json also holds ``fields``."""
    artifact = folder / "tiny"
    shutil.copytree(tiny, artifact)
    path = artifact / "generation_config.json"
    config = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**config, **fields}))
    return artifact


@pytest.fixture(scope="module")
def creator_defaults(tiny_llama_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama whose creator recommends top_k 1 (greedy) and 5 new tokens."""
    return with_generation_config(
        tiny_llama_artifact, tmp_path_factory.mktemp("generation-config"), top_k=1, max_new_tokens=5
    )


@pytest.fixture(scope="module")
def api(creator_defaults: Path) -> Iterator[openai.OpenAI]:
    server: ServerProcess
    for server in serve_tiny(creator_defaults):
        yield openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def complete(api: openai.OpenAI, top_k: int | None = None, **fields) -> tuple[str, int]:
    extra = {"ignore_eos": True, **({"top_k": top_k} if top_k is not None else {})}
    reply = api.completions.create(model=TINY_NAME, prompt=PROMPT, extra_body=extra, **fields)
    return reply.choices[0].text, reply.usage.completion_tokens


def test_a_request_that_leaves_fields_out_gets_the_model_s_defaults(api):
    greedy = complete(api, temperature=0, max_tokens=5)
    assert complete(api, seed=1) == complete(api, seed=2) == greedy  # top_k 1, 5 tokens
    assert complete(api, seed=1, max_tokens=7)[1] == 7


def test_what_a_request_sets_wins_over_the_model_s_defaults(api):
    first, second = complete(api, seed=1, top_k=0), complete(api, seed=2, top_k=0)
    assert first[1] == second[1] == 5 and first[0] != second[0]  # sampling from the whole vocabulary


def test_offline_defaults_follow_the_same_file(creator_defaults):
    params = LLM(model=str(creator_defaults), kv_cache_space=0.05).get_default_sampling_params()
    assert (params.top_k, params.max_tokens) == (1, 5)
    plain = LLM(model=str(creator_defaults), kv_cache_space=0.05, generation_config="vllm")
    assert (plain.get_default_sampling_params().top_k, plain.get_default_sampling_params().max_tokens) == (0, 16)


@pytest.fixture(scope="module")
def sampling_creator(tiny_llama_artifact: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Llama whose creator samples at temperature 1 and stops at 5 new tokens."""
    folder = tmp_path_factory.mktemp("generation-config-cli")
    return with_generation_config(tiny_llama_artifact, folder, temperature=1.0, max_new_tokens=5)


def generate(artifact: Path, *flags: str) -> tuple[str, str]:
    """`ortserve generate` on the artifact: (the answer, the summary line)."""
    argv = [sys.executable, "-m", "ortserve.cli", "generate", PROMPT, "--no-chat", "--model", str(artifact)]
    result = subprocess.run([*argv, "--kv-cache-space", "0.05", *flags], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout, result.stderr.strip().splitlines()[-1]


def test_generate_cli_samples_with_the_model_s_defaults_under_the_typed_flags(sampling_creator):
    first, second = generate(sampling_creator, "--seed", "1"), generate(sampling_creator, "--seed", "2")
    assert "5 generated" in first[1] and "5 generated" in second[1]  # max_new_tokens, not the CLI's 256
    assert first[0] != second[0]  # temperature 1 from the file, not the CLI's greedy default
    greedy = [generate(sampling_creator, "--seed", seed, "--temperature", "0")[0] for seed in ("1", "2")]
    assert greedy[0] == greedy[1]  # a typed flag wins
    vllm = ("--generation-config", "vllm", "--max-tokens", "5")
    plain = [generate(sampling_creator, "--seed", seed, *vllm)[0] for seed in ("1", "2")]
    assert plain[0] == plain[1] == greedy[0][: len(plain[0])]  # the file ignored: the CLI's greedy default
