"""`ortserve export` through the real command line: bad input gives one clear error line, a
non-zero exit and no OUT directory (nor a temporary one beside it); good input gives an artifact."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ortserve.artifact import has_tokenizer, is_artifact, load_manifest


def ortserve_export(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ortserve.cli", "export", *args], capture_output=True, text=True, timeout=300
    )


def assert_clean_failure(result: subprocess.CompletedProcess, out: Path, *fragments: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ortserve export: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


@pytest.fixture
def broken(tiny_checkpoint, tmp_path):
    """A copy of a good tiny checkpoint, to damage."""
    return Path(shutil.copytree(tiny_checkpoint("llama2"), tmp_path / "checkpoint"))


def test_missing_source_is_one_line_error(tmp_path):
    out = tmp_path / "out"
    assert_clean_failure(ortserve_export(str(tmp_path / "nowhere"), "-o", str(out)), out, "nowhere")


def test_directory_without_config_is_one_line_error(tmp_path):
    (tmp_path / "empty").mkdir()
    out = tmp_path / "out"
    assert_clean_failure(ortserve_export(str(tmp_path / "empty"), "-o", str(out)), out, "config.json")


def test_unsupported_architecture_lists_supported_ones(broken, tmp_path):
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "model_type": "falcon"}))
    out = tmp_path / "out"
    assert_clean_failure(ortserve_export(str(broken), "-o", str(out)), out, "'falcon'", "llama", "gemma3_text", "gpt2")


def test_head_dim_below_the_ops_range_is_refused_at_export_naming_the_limit(broken, tmp_path):
    """PagedAttention runs head sizes 32..256: a 16-wide head fails at export, not at inference."""
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "head_dim": 16}))
    out = tmp_path / "out"
    assert_clean_failure(
        ortserve_export(str(broken), "-o", str(out)),
        out,
        "head_dim 16 (config.json) is outside the 32..256 that ortserve's PagedAttention op supports",
    )


def test_corrupt_config_json_is_one_line_error(broken, tmp_path):
    (broken / "config.json").write_text("{ not json")
    out = tmp_path / "out"
    assert_clean_failure(ortserve_export(str(broken), "-o", str(out)), out, "config.json")


def test_truncated_safetensors_is_one_line_error(broken, tmp_path):
    weights = broken / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    out = tmp_path / "out"
    assert_clean_failure(ortserve_export(str(broken), "-o", str(out)), out, "truncated")


def test_garbage_safetensors_is_one_line_error(broken, tmp_path):
    (broken / "model.safetensors").write_bytes(b"\x00garbage" * 1000)
    out = tmp_path / "out"
    assert_clean_failure(ortserve_export(str(broken), "-o", str(out)), out, "model.safetensors")


def test_missing_weights_file_is_one_line_error(broken, tmp_path):
    (broken / "model.safetensors").unlink()
    out = tmp_path / "out"
    assert_clean_failure(ortserve_export(str(broken), "-o", str(out)), out, "model.safetensors")


def test_config_that_does_not_match_the_weights_is_one_line_error(broken, tmp_path):
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3}))
    out = tmp_path / "out"
    assert_clean_failure(ortserve_export(str(broken), "-o", str(out)), out, "model.layers.2")


def test_out_that_is_not_an_artifact_is_left_alone(tiny_checkpoint, tmp_path):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    result = ortserve_export(str(tiny_checkpoint("llama2")), "-o", str(out))
    assert result.returncode != 0 and "not an ortserve artifact" in result.stderr
    assert (out / "notes.txt").read_text() == "keep me"


def test_max_model_len_beyond_the_model_is_one_line_error(tiny_checkpoint, tmp_path):
    out = tmp_path / "out"
    assert_clean_failure(
        ortserve_export(str(tiny_checkpoint("llama2")), "-o", str(out), "--max-model-len", "4096"),
        out,
        "--max-model-len",
        "128",
    )


def test_export_writes_an_artifact_and_a_summary(tiny_checkpoint, tmp_path):
    out = tmp_path / "nested" / "artifact"
    result = ortserve_export(
        str(tiny_checkpoint("qwen2_qkv_bias_tied")),
        "-o",
        str(out),
        "--precision",
        "int4",
        "--lm-head-precision",
        "int8",
        "--max-model-len",
        "64",
    )
    assert result.returncode == 0, result.stderr
    assert is_artifact(out)
    for stage in ("build", "load", "quantise", "save"):
        assert stage in result.stderr
    for fact in ("parameters", "weights", "time", "peak RSS"):
        assert fact in result.stderr
    manifest = load_manifest(out)
    assert (manifest.weight_precision, manifest.lm_head_precision, manifest.max_model_len) == ("int4", "int8", 64)


def test_a_checkpoint_without_a_tokenizer_exports_and_says_that_serving_needs_one(broken, tmp_path):
    from ortserve.tokenizer import load_tokenizer

    assert not has_tokenizer(broken)  # the tiny checkpoints are weights and config only
    out = tmp_path / "artifact"
    result = ortserve_export(str(broken), "-o", str(out))
    assert result.returncode == 0, result.stderr
    needs = f"tokenizer    none: serve and generate need tokenizer.json or tokenizer_config.json in {out}"
    assert needs in result.stderr
    with pytest.raises(ValueError, match="has no tokenizer .*: copy the checkpoint's tokenizer files into it"):
        load_tokenizer(out)


def test_tensor_precision_reaches_export_from_the_command_line(tiny_checkpoint, tmp_path):
    good, bad = tmp_path / "good", tmp_path / "bad"
    source = str(tiny_checkpoint("llama2"))
    result = ortserve_export(source, "-o", str(good), "--precision", "int4", "--tensor-precision", "v_proj=int8")
    assert result.returncode == 0, result.stderr
    # 2 layers: q, k, o, gate, up, down at int4; v of each layer and the LM head at int8
    assert load_manifest(good).weight_formats == {"int4": 12, "int8": 3}
    result = ortserve_export(source, "-o", str(bad), "--precision", "int4", "--tensor-precision", "attn_v=int8")
    assert_clean_failure(result, bad, "--tensor-precision 'attn_v=int8' matches no linear weight")


def test_export_replaces_an_existing_artifact(tiny_checkpoint, tmp_path):
    out = tmp_path / "artifact"
    assert ortserve_export(str(tiny_checkpoint("llama2")), "-o", str(out), "--quiet").returncode == 0
    assert ortserve_export(str(tiny_checkpoint("gpt2_conv1d")), "-o", str(out), "--quiet").returncode == 0
    assert load_manifest(out).architecture == "gpt2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact"]


def test_int4_export_reports_the_quality_check_against_fp32(tiny_llama_checkpoint, tmp_path):
    """The printed top-1 agreement and perplexity ratio are those of the int4 artifact against
    transformers' fp32 model on the check's built-in text."""
    import re

    import torch
    from ortserve.export import quality
    from transformers import AutoModelForCausalLM

    result = ortserve_export(str(tiny_llama_checkpoint), "-o", str(tmp_path / "int4"), "--precision", "int4")
    assert result.returncode == 0, result.stderr
    assert "tokenizer    none" not in result.stderr  # SmolLM2's tokenizer came with it
    line = next(x for x in result.stderr.splitlines() if x.strip().startswith("quality") and "agreement" in x)
    top1, ratio = re.search(r"agreement with fp32 ([\d.]+)%.*\(ratio ([\d.]+)\)", line).groups()  # type: ignore[union-attr]
    sequences = quality.text_ids(tmp_path / "int4")
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        reference = [model(torch.tensor([s])).logits[0].numpy() for s in sequences]
    expected = quality.compare(quality.all_logits(tmp_path / "int4", sequences), reference, sequences)
    assert abs(float(top1) - 100 * expected.top1_agreement) <= 0.1 and abs(float(ratio) - expected.ppl_ratio) <= 1e-3
    assert ("below the check" in line) == (not expected.ok)
    assert not (tmp_path / "int4" / ".fp32-reference").exists()


def test_a_missing_calibration_text_is_one_line_error_naming_the_flag(tiny_llama_checkpoint, tmp_path):
    out, missing = tmp_path / "out", tmp_path / "nowhere.txt"
    result = ortserve_export(str(tiny_llama_checkpoint), "-o", str(out), "--precision", "int4", "--calibration-text")
    assert result.returncode != 0  # argparse: the flag needs FILE
    assert_clean_failure(
        ortserve_export(
            str(tiny_llama_checkpoint), "-o", str(out), "--precision", "int4", "--calibration-text", str(missing)
        ),
        out,
        f"--calibration-text {missing}: cannot read it as UTF-8 text",
    )


def test_no_calibration_flag_exports_uncalibrated(tiny_llama_checkpoint, tmp_path):
    out = tmp_path / "out"
    result = ortserve_export(str(tiny_llama_checkpoint), "-o", str(out), "--precision", "int4", "--no-calibration")
    assert result.returncode == 0, result.stderr
    assert load_manifest(out).calibration == "" and "calibrated" not in result.stderr
    result = ortserve_export(str(tiny_llama_checkpoint), "-o", str(out), "--precision", "int4")
    assert load_manifest(out).calibration.endswith("tokens of built-in text")
    assert "calibrated   on " in result.stderr
