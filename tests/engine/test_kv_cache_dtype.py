"""--kv-cache-dtype: fp16 and int8 KV caches give the fp32 cache's logits within their rounding,
through the engine's own model runner on the tiny Llama; the memory plan counts their smaller
rows; an artifact from before compact caches is refused naming the flag."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from ortserve.export.validate import PagedRunner

from ortserve.artifact import ArtifactError, load_manifest
from ortserve.engine.memory import GIB, plan_kv_cache

PROMPTS = {0: list(range(100, 137)), 1: list(range(500, 509))}  # two sequences, one prefill chunk each
DECODE_STEPS = 24


def teacher_forced_logits(artifact, dtype: str) -> np.ndarray:
    """Logits of every position: a prefill per sequence, then decodes of fixed tokens."""
    runner = PagedRunner(artifact, kv_cache_dtype=dtype, threads=2)
    rows = [np.concatenate(runner.step(list(PROMPTS.items()), all_logits=True))]
    rng = np.random.default_rng(0)
    for _ in range(DECODE_STEPS):
        step = [(seq, [int(rng.integers(0, 49152))]) for seq in PROMPTS]
        rows.append(np.stack(runner.step(step)))
    return np.concatenate(rows)


@pytest.fixture(scope="module")
def fp32_logits(tiny_llama_artifact):
    return teacher_forced_logits(tiny_llama_artifact, "fp32")


@pytest.mark.parametrize("dtype,tolerance", [("fp16", 2e-3), ("int8", 3e-2)])
def test_compact_caches_keep_the_fp32_cache_logits(tiny_llama_artifact, fp32_logits, dtype, tolerance, report_figure):
    logits = teacher_forced_logits(tiny_llama_artifact, dtype)
    scale = np.abs(fp32_logits).max()
    diff = np.abs(logits - fp32_logits).max() / scale
    top1 = (logits.argmax(axis=1) == fp32_logits.argmax(axis=1)).mean()
    report_figure(f"tiny llama, {dtype} KV cache vs fp32: max |logit diff| / max |logit| {diff:.2e}, top-1 {top1:.1%}")
    assert 0 < diff <= tolerance  # 0 would mean the cache was not compact at all
    assert top1 >= 0.95


def test_the_memory_plan_counts_compact_rows(tiny_llama_artifact):
    manifest = load_manifest(tiny_llama_artifact)  # 2 layers x 2 kv heads x 32
    plans = {d: plan_kv_cache(manifest, 16, 0.01, 4.0, available=64 * GIB, dtype=d) for d in ("fp32", "fp16", "int8")}
    assert plans["fp32"].bytes_per_block == 2 * 2 * 2 * 32 * 4 * 16
    assert plans["fp16"].bytes_per_block * 2 == plans["fp32"].bytes_per_block
    assert plans["int8"].bytes_per_block == 2 * 2 * 2 * (32 + 4) * 16
    assert plans["int8"].num_blocks > 3 * plans["fp32"].num_blocks


def test_an_artifact_before_compact_caches_is_refused_naming_the_flag(tiny_llama_artifact, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(tiny_llama_artifact, old)
    manifest = json.loads((old / "ortserve.json").read_text())
    manifest["op_version"] = 2
    (old / "ortserve.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="--kv-cache-dtype fp16 needs an artifact of op_version 3"):
        PagedRunner(old, kv_cache_dtype="fp16")


def test_auto_is_fp16_where_the_graph_takes_compact_caches_and_fp32_before(tiny_llama_artifact, tmp_path):
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.core import EngineCore

    assert EngineConfig().kv_cache_dtype == "auto"
    engine = EngineCore(EngineConfig(model=str(tiny_llama_artifact), kv_cache_space=0.01, threads_bind="nobind"))
    assert engine.kv_plan.dtype == "fp16"
    assert engine.runner.kv_caches[0].dtype == np.float16
    assert engine.kv_plan.bytes_per_block == load_manifest(tiny_llama_artifact).kv_bytes_per_token("fp16") * 16

    old = tmp_path / "old"
    shutil.copytree(tiny_llama_artifact, old)
    manifest = json.loads((old / "ortserve.json").read_text())
    manifest["op_version"] = 2
    (old / "ortserve.json").write_text(json.dumps(manifest))
    assert load_manifest(old).kv_cache_row_dtype("auto") == "fp32"
    assert load_manifest(old).kv_cache_row_dtype("int8") == "int8"  # asked for: refused at load, naming the flag
