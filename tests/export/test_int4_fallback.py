"""int4 that keeps its answers: a calibrated int4 export that loses a model's answers on its
calibration text quantises again with Q4_K_M's mix of bits (export/int4_fallback.py). Tiny random
checkpoints have no answers to keep (their fp32 perplexity is that of a uniform guess), so the tests
that need the fallback to run declare them informative. That the layers chosen are the ones
llama.cpp's Q4_K_M gives more bits is checked against a real Q4_K_M file's tensor types in
benchmarks/quality.py; what the fallback does to a real model's answers is in
benchmarks/tables/quality.md."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
from ortserve.export import export_model, int4_fallback
from ortserve.export.architectures import architecture_for
from ortserve.export.quality import all_logits
from ortserve.export.validate import random_sequences


def manifest(artifact: Path) -> dict:
    return json.loads((artifact / "ortserve.json").read_text())


def logit_error(artifact: Path, reference: Path) -> float:
    """Root mean square difference of the logits from the reference's on random ids."""
    sequences = random_sequences(49152, [48, 31], seed=5)
    diffs = [a - b for a, b in zip(all_logits(artifact, sequences), all_logits(reference, sequences))]
    return float(np.sqrt(np.mean(np.concatenate([d.ravel() for d in diffs]) ** 2)))


@pytest.fixture
def informative(monkeypatch):
    """Count a random checkpoint's answers as worth keeping."""
    monkeypatch.setattr(int4_fallback, "UNINFORMED_PPL_SHARE", float("inf"))


def test_int4_that_loses_answers_takes_q4_k_m_s_bits(
    informative, tiny_llama_checkpoint, tiny_llama_artifact, tmp_path, caplog
):
    with caplog.at_level(logging.WARNING, logger="ortserve.export.pipeline"):
        export_model(tiny_llama_checkpoint, tmp_path / "mixed", precision="int4", progress=False)
    assert "int4 everywhere loses this model's answers on the calibration text (top-1 agreement" in caplog.text
    assert "(--pure keeps 4 bits everywhere)" in caplog.text
    # 2 layers: llama.cpp's rule gives layer 1 more bits (7 * 2 // 8 = 1); its v and down at 8 bits,
    # every q, k, v, gate and up at 5, o and layer 0's down at 4; the untied LM head at 8
    assert manifest(tmp_path / "mixed")["weight_formats"] == {"int5": 9, "int4": 3, "int8": 3}
    export_model(tiny_llama_checkpoint, tmp_path / "uniform", precision="int4", pure=True, progress=False)
    assert manifest(tmp_path / "uniform")["weight_formats"] == {"int4": 14, "int8": 1}
    assert logit_error(tmp_path / "mixed", tiny_llama_artifact) < 0.85 * logit_error(
        tmp_path / "uniform", tiny_llama_artifact
    )


def test_a_model_with_no_answers_keeps_4_bits(tiny_llama_checkpoint, tmp_path, caplog):
    """A random checkpoint predicts nothing (perplexity about its vocabulary), so there is nothing
    to keep: int4 stays 4 bits, without a second pass."""
    with caplog.at_level(logging.WARNING, logger="ortserve.export.pipeline"):
        export_model(tiny_llama_checkpoint, tmp_path / "int4", precision="int4", progress=False)
    assert manifest(tmp_path / "int4")["weight_formats"] == {"int4": 14, "int8": 1}
    assert "loses this model's answers" not in caplog.text


def test_more_bits_takes_the_first_and_last_eighth_and_every_third_layer():
    assert [i for i in range(18) if int4_fallback.more_bits(i, 18)] == [0, 1, 4, 7, 10, 13, 15, 16, 17]
    assert [i for i in range(24) if int4_fallback.more_bits(i, 24)] == [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]


@pytest.mark.parametrize(
    "case, formats",
    [  # 2 layers, layer 1 with more bits; fused q/k/v (phi3, GPT-2) is one weight at 5 bits, so only
        # layer 1's down is at 8; GPT-2 has no gate; the LM head (tied or not) is at 8 bits
        ("phi3_fused_partial_rotary", {"int5": 4, "int4": 3, "int8": 2}),
        ("gpt2_conv1d", {"int5": 4, "int4": 3, "int8": 2}),
        ("gemma3_local_global", {"int5": 9, "int4": 3, "int8": 3}),
    ],
)
def test_the_rules_name_each_familys_linears(case, formats, tiny_checkpoint, tmp_path):
    checkpoint = tiny_checkpoint(case)
    config = json.loads((checkpoint / "config.json").read_text())
    arch = architecture_for(config["model_type"])
    rules = [str(rule) for rule in int4_fallback.rules(arch.names, 2)]
    export_model(checkpoint, tmp_path / "out", precision="int4", tensor_precision=rules, progress=False)
    assert manifest(tmp_path / "out")["weight_formats"] == formats


def test_pooled_reports_equal_one_report_over_every_position():
    """The check compares a chunk at a time (a chunk's logits over a 262k vocabulary are 400 MB)."""
    from ortserve.export.quality import compare, pooled

    rng = np.random.default_rng(0)
    sequences = [list(rng.integers(0, 50, n)) for n in (9, 17, 5)]
    fp32 = [rng.standard_normal((len(s), 50)).astype(np.float32) for s in sequences]
    quantised = [f + rng.standard_normal(f.shape).astype(np.float32) * 0.7 for f in fp32]
    whole = compare(quantised, fp32, sequences)
    parts = pooled([compare([q], [f], [s]) for q, f, s in zip(quantised, fp32, sequences)])
    assert parts.positions == whole.positions == 28 and 0.3 < whole.top1_agreement < 1
    assert parts.top1_agreement == pytest.approx(whole.top1_agreement)
    assert parts.perplexity == pytest.approx(whole.perplexity) and parts.fp32_perplexity == pytest.approx(
        whole.fp32_perplexity
    )
