"""The shared tiny Llama fixtures are what conftest.py promises, and their export is exact."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ortserve.artifact import load_manifest

pytestmark = pytest.mark.slow


def test_tiny_llama_checkpoint_has_the_promised_shape_and_a_real_tokenizer(tiny_llama_checkpoint: Path):
    from transformers import AutoTokenizer

    config = json.loads((tiny_llama_checkpoint / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("llama", 2, 64)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 2, 32)
    assert config["vocab_size"] == 49152
    tokenizer = AutoTokenizer.from_pretrained(tiny_llama_checkpoint)
    assert len(tokenizer) == 49152 and tokenizer.eos_token == "<|im_end|>"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>assistant\n")


def test_tiny_llama_artifact_matches_transformers(
    tiny_llama_artifact: Path, tiny_llama_checkpoint: Path, report_figure
):
    from ortserve.export.validate import validate_artifact

    manifest = load_manifest(tiny_llama_artifact)
    assert (manifest.num_layers, manifest.num_kv_heads, manifest.weight_precision) == (2, 2, "fp32")
    report = validate_artifact(tiny_llama_artifact, tiny_llama_checkpoint, tolerance=1e-4)
    report_figure(f"tiny llama fp32: {report.summary()}")
    assert report.ok, report.summary()
