"""A GGUF file without a chat template gets its family's built-in one (logged); a family with
none that fits gets none (chat then needs --chat-template)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from ortserve.models import gguf_checkpoint
from ortserve.models.chat_templates import builtin_template
from tiny_gguf import write_tiny_llama

CHAT = [
    {"role": "system", "content": "Be terse."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "Bye"},
]


def test_the_template_is_picked_by_architecture_among_those_the_vocabulary_can_spell():
    assert builtin_template("gemma3", {"<start_of_turn>", "<end_of_turn>"}).name == "gemma"  # type: ignore[union-attr]
    assert builtin_template("phi3", {"<|im_start|>", "<|im_end|>"}).name == "chatml"  # type: ignore[union-attr]
    llama3 = {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
    assert builtin_template("llama", llama3).name == "llama3"  # type: ignore[union-attr]
    assert builtin_template("llama", set()).name == "mistral"  # type: ignore[union-attr]
    assert builtin_template("gemma", set()) is None and builtin_template("gpt2", llama3) is None


def test_the_gemma_template_writes_gemmas_turns():
    from jinja2 import Template

    source = builtin_template("gemma3", {"<start_of_turn>", "<end_of_turn>"}).source  # type: ignore[union-attr]
    text = Template(source).render(messages=CHAT, add_generation_prompt=True, bos_token="<bos>")
    assert text == (
        "<bos><start_of_turn>user\nBe terse.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    )


def test_a_gguf_without_a_template_gets_the_builtin_one_and_the_log_says_which(tmp_path: Path, monkeypatch, caplog):
    from transformers import AutoTokenizer

    monkeypatch.setenv("ORTSERVE_CACHE_DIR", str(tmp_path / "cache"))
    write_tiny_llama(tmp_path / "tiny.gguf", "Q8_0")
    with caplog.at_level(logging.WARNING):
        folder = gguf_checkpoint(tmp_path / "tiny.gguf", progress=False)
    assert "using the built-in 'mistral' template for llama (override with --chat-template" in caplog.text
    rendered = AutoTokenizer.from_pretrained(folder).apply_chat_template(CHAT[1:2], tokenize=False)
    assert rendered == "<s>[INST] Hi [/INST]"


def test_a_gguf_s_sampling_defaults_become_the_model_s_request_defaults(tmp_path: Path, monkeypatch):
    from ortserve.sampling_params import model_sampling_defaults

    monkeypatch.setenv("ORTSERVE_CACHE_DIR", str(tmp_path / "cache"))
    sampling = {"general.sampling.temp": 0.6, "general.sampling.top_k": 20, "general.sampling.penalty_repeat": 1.1}
    write_tiny_llama(tmp_path / "tiny.gguf", "Q8_0", metadata=sampling)
    folder = gguf_checkpoint(tmp_path / "tiny.gguf", progress=False)
    expected = {"temperature": 0.6, "top_k": 20, "repetition_penalty": 1.1}
    assert model_sampling_defaults(folder) == pytest.approx(expected)
    write_tiny_llama(tmp_path / "plain.gguf", "Q8_0")
    assert model_sampling_defaults(gguf_checkpoint(tmp_path / "plain.gguf", progress=False)) == {}
