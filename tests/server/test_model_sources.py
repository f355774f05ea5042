"""``ortserve serve MODEL`` for every kind of model argument: a Hugging Face checkpoint directory
and a .gguf file are exported on the first start (into the cache, keyed by their content) and
served; the second start reuses the export. Greedy completions equal transformers' on the same
weights (the tiny Llama's logits have clear winners)."""

from __future__ import annotations

import sys
from pathlib import Path

import openai
import pytest
from server_process import ServerProcess

sys.path.insert(0, str(Path(__file__).parents[1] / "models"))  # the GGUF writers of tests/models
from llama_gguf import write_llama_gguf

pytestmark = pytest.mark.slow

PROMPT = [1, 520, 3112, 314, 260, 1345, 30]  # token ids: the tiny model's tokenizer is SmolLM2's


def transformers_greedy(checkpoint: Path, prompt: list[int], n: int) -> list[int]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, len(prompt) :].tolist()


def serve(model: Path, cache: Path, *flags: str) -> ServerProcess:
    proc = ServerProcess.real(
        model, "--served-model-name", "m", "--threads-bind", "nobind", *flags, env={"ORTSERVE_CACHE_DIR": str(cache)}
    )
    proc.wait_ready(600)
    return proc


def greedy_text(proc: ServerProcess, prompt: list[int], n: int) -> str:
    api = openai.OpenAI(base_url=f"{proc.base_url}/v1", api_key="none", max_retries=0, timeout=120)
    out = api.completions.create(model="m", prompt=prompt, max_tokens=n, temperature=0, extra_body={"ignore_eos": True})
    assert out.usage is not None and out.usage.completion_tokens == n
    return out.choices[0].text


@pytest.mark.parametrize("source", ["checkpoint", "gguf"])
def test_serve_exports_a_checkpoint_or_gguf_on_first_start_and_reuses_it(
    source, tiny_llama_checkpoint: Path, smollm2_checkpoint: Path, tmp_path: Path
):
    from transformers import AutoTokenizer

    if source == "gguf":
        model = tmp_path / "tiny.gguf"
        write_llama_gguf(tiny_llama_checkpoint, model, smollm2_gguf())
    else:
        model = tiny_llama_checkpoint
    expected = AutoTokenizer.from_pretrained(tiny_llama_checkpoint).decode(
        transformers_greedy(tiny_llama_checkpoint, PROMPT, 8)
    )
    cache = tmp_path / "cache"
    for start in ("first", "second") if source == "gguf" else ("first",):  # reuse: once is enough
        proc = serve(model, cache)
        try:
            assert greedy_text(proc, PROMPT, 8) == expected
        finally:
            assert proc.stop() == 0
        exported = "Exporting" in proc.output
        assert exported == (start == "first"), proc.output[-3000:]
    assert len([p for p in (cache / "artifacts").iterdir() if not p.name.startswith(".")]) == 1


def smollm2_gguf() -> Path:
    from ortserve.models import BUILTIN_MODELS, DEFAULT_MODEL

    return BUILTIN_MODELS[DEFAULT_MODEL].gguf_path()
