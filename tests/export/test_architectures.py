"""Every supported architecture, exported fp32, matches transformers' logits within 1e-4 over a
2-sequence flattened batch: prefill, then 4 decode steps each, block size 16, shuffled blocks."""

from __future__ import annotations

import numpy as np
import pytest
from export_cases import CASES, LARGEST_DIFFS
from ortserve.export.validate import PagedRunner, random_sequences, teacher_forced_logits, transformers_logits

from ortserve.artifact import load_manifest

PROMPTS, DECODES, TOLERANCE = (19, 7), 4, 1e-4


def _sequences(artifact):
    vocab = load_manifest(artifact).vocab_size
    return random_sequences(vocab, [n + DECODES for n in PROMPTS], seed=1)


@pytest.mark.parametrize("case", list(CASES))
def test_fp32_logits_match_transformers(case, tiny_checkpoint, tiny_artifact):
    artifact = tiny_artifact(case)
    sequences = _sequences(artifact)
    ours = teacher_forced_logits(PagedRunner(artifact, block_size=16, seed=3), sequences, PROMPTS)
    reference = transformers_logits(tiny_checkpoint(case), sequences)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, reference))
    LARGEST_DIFFS[case] = diff
    assert diff <= TOLERANCE, f"{case}: max |logit diff| {diff:.2e} > {TOLERANCE}"


@pytest.mark.parametrize("case", ["llama2", "mistral_sliding_window", "gemma3_local_global", "gpt2_conv1d"])
def test_mixed_prefill_chunks_and_decodes_in_one_step_match(case, tiny_checkpoint, tiny_artifact):
    """Sequence 1 joins a step later and prefills in chunks of 5 while sequence 0 decodes."""
    artifact = tiny_artifact(case)
    sequences = _sequences(artifact)
    ours = teacher_forced_logits(
        PagedRunner(artifact, block_size=16, seed=4), sequences, PROMPTS, prefill_chunk=5, stagger=True
    )
    reference = transformers_logits(tiny_checkpoint(case), sequences)
    assert max(float(np.abs(a - b).max()) for a, b in zip(ours, reference)) <= TOLERANCE


def test_last_token_logits_equal_all_rows_last_token(tiny_artifact):
    """logits_indices picks rows: asking only for each sequence's last row changes nothing."""
    artifact = tiny_artifact("llama2")
    sequences = _sequences(artifact)
    batch = [(i, s) for i, s in enumerate(sequences)]
    all_rows = PagedRunner(artifact, seed=5).step(batch, all_logits=True)
    last_rows = PagedRunner(artifact, seed=6).step(batch)
    for full, last in zip(all_rows, last_rows):
        np.testing.assert_allclose(full[-1], last, atol=1e-5)


def test_block_size_is_the_callers_choice(tiny_checkpoint, tiny_artifact):
    """The cache's block_size axis is dynamic: the same artifact runs with blocks of 32."""
    artifact = tiny_artifact("qwen3_qk_norm")
    sequences = _sequences(artifact)
    ours = teacher_forced_logits(PagedRunner(artifact, block_size=32, seed=7), sequences, PROMPTS)
    reference = transformers_logits(tiny_checkpoint("qwen3_qk_norm"), sequences)
    assert max(float(np.abs(a - b).max()) for a, b in zip(ours, reference)) <= TOLERANCE
