"""Engine test fixtures: CPU affinity restored after each test (the engine pins its calling
thread), and transformers' greedy generation as the reference for the real-model tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def restore_cpu_affinity():
    before = os.sched_getaffinity(0)
    yield
    os.sched_setaffinity(0, before)


@pytest.fixture(scope="session")
def hf_greedy(smollm2_checkpoint):
    """greedy(prompt_ids, max_new_tokens) -> transformers' greedy generate tokens (stops at EOS)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_checkpoint, dtype=torch.float32).eval()
    # Start torch's thread pool now, while this thread may use every core: threads inherit the
    # affinity of the thread that creates them, and an engine pins its calling thread.
    with torch.inference_mode():
        model(torch.zeros(1, 4, dtype=torch.long))
    cache: dict[tuple, list[int]] = {}

    def greedy(prompt_ids, max_new_tokens: int) -> list[int]:
        key = (tuple(prompt_ids), max_new_tokens)
        if key not in cache:
            with torch.inference_mode():
                out = model.generate(
                    torch.tensor([list(prompt_ids)]),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                )
            cache[key] = out[0, len(prompt_ids) :].tolist()
        return cache[key]

    return greedy


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_artifact):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_artifact)
