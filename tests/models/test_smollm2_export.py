"""The real SmolLM2-135M-Instruct, exported: fp32 matches transformers, int8/int4 match fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from ortserve.export.validate import (
    PagedRunner,
    greedy_generate,
    teacher_forced_logits,
    top1_agreement,
    transformers_logits,
    validate_artifact,
)
from ortserve.models import DEFAULT_MODEL, resolve_model

from ortserve.artifact import load_manifest

pytestmark = pytest.mark.slow

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about autumn leaves."}],
    "The three primary colors are",
    "def fibonacci(n):\n    ",
]
PASSAGES = [
    "The Industrial Revolution began in Great Britain in the late eighteenth century and spread to "
    "continental Europe and North America. It replaced hand production with machines, new chemical "
    "processes and iron production, and it changed how people lived and worked. Cities grew quickly "
    "as workers moved from farms to factories, and steam power made railways and ships faster.",
    "Photosynthesis is the process by which green plants use sunlight, water and carbon dioxide to "
    "make glucose and oxygen. It takes place mainly in the chloroplasts of leaf cells, where the "
    "pigment chlorophyll absorbs light. The oxygen released is what most living things breathe.",
    "import numpy as np\n\n\ndef softmax(x, axis=-1):\n    shifted = x - x.max(axis=axis, keepdims=True)\n"
    "    exp = np.exp(shifted)\n    return exp / exp.sum(axis=axis, keepdims=True)\n\n\nprint(softmax(np.arange(4)))\n",
    "<|im_start|>user\nGive me three tips for a good night's sleep.<|im_end|>\n<|im_start|>assistant\n"
    "1. Keep a regular schedule: go to bed and wake up at the same time every day.\n2. Avoid screens "
    "for an hour before bed.\n3. Keep your bedroom cool, dark and quiet.<|im_end|>\n",
    "Once upon a time, in a small village at the edge of a forest, there lived an old baker named "
    "Tomas. Every morning before sunrise he lit his oven and baked bread for the whole village. One "
    "winter the flour ran out, and the children went hungry until a stranger arrived with a cart.",
    "To find the area of a circle, multiply pi by the square of the radius. For example, a circle "
    "with a radius of 3 centimetres has an area of about 28.27 square centimetres, because 3 squared "
    "is 9 and 9 times 3.14159 is roughly 28.27.",
    "The Amazon rainforest covers much of the Amazon basin in South America. It is home to millions "
    "of species of insects, plants, birds and other forms of life, many of which have not yet been "
    "described by scientists. Deforestation threatens the forest and the climate of the whole planet.",
    "<|im_start|>user\nHow do I reverse a list in Python?<|im_end|>\n<|im_start|>assistant\n"
    "You can reverse a list in place with my_list.reverse(), or make a reversed copy with "
    "my_list[::-1]. The built-in reversed() function returns an iterator.<|im_end|>\n",
]


@pytest.fixture(scope="module")
def tokenizer(smollm2_checkpoint: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_checkpoint)


@pytest.fixture(scope="module")
def prompt_ids(tokenizer) -> list[list[int]]:
    return [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
        if isinstance(p, list)
        else tokenizer(p)["input_ids"]
        for p in PROMPTS
    ]


@pytest.fixture(scope="module")
def passage_ids(tokenizer) -> list[list[int]]:
    return [tokenizer(text)["input_ids"] for text in PASSAGES]


@pytest.fixture(scope="module")
def fp32_passage_logits(smollm2_artifact: Path, passage_ids) -> list[np.ndarray]:
    return teacher_forced(smollm2_artifact, passage_ids)


def teacher_forced(artifact: Path, sequences: list[list[int]]) -> list[np.ndarray]:
    """All positions' logits: the first half of each passage prefilled in chunks of 16, the rest
    decoded a token per step, sequences joining one step apart (mixed prefill/decode batches)."""
    runner = PagedRunner(artifact, num_blocks=128)
    return teacher_forced_logits(runner, sequences, [len(s) // 2 for s in sequences], prefill_chunk=16, stagger=True)


def test_fp32_logits_match_transformers_on_random_tokens(
    smollm2_artifact: Path, smollm2_checkpoint: Path, report_figure
):
    report = validate_artifact(smollm2_artifact, smollm2_checkpoint, tolerance=1e-3)
    report_figure(f"SmolLM2 fp32, random tokens: {report.summary()}")
    assert report.ok, report.summary()


def test_fp32_logits_match_transformers_on_text(
    smollm2_checkpoint: Path, passage_ids, fp32_passage_logits, report_figure
):
    reference = transformers_logits(smollm2_checkpoint, passage_ids)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(fp32_passage_logits, reference))
    agreement = top1_agreement(fp32_passage_logits, reference)
    positions = sum(map(len, passage_ids))
    report_figure(
        f"SmolLM2 fp32, text: max |logit diff| {diff:.2e}, top-1 agreement {agreement:.1%} over {positions} positions"
    )
    assert diff <= 1e-3


def test_greedy_continuations_equal_transformers_generate(
    smollm2_artifact: Path, smollm2_checkpoint: Path, prompt_ids, tokenizer
):
    import torch
    from transformers import AutoModelForCausalLM

    stop_ids = load_manifest(smollm2_artifact).eos_token_ids
    ours = greedy_generate(PagedRunner(smollm2_artifact), prompt_ids, 32, stop_ids=stop_ids)
    model = AutoModelForCausalLM.from_pretrained(smollm2_checkpoint, dtype=torch.float32).eval()
    for prompt, continuation in zip(prompt_ids, ours):
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=32,
                do_sample=False,
                eos_token_id=stop_ids,
            )
        reference = out[0, len(prompt) :].tolist()
        print(f"\n{tokenizer.decode(prompt)!r}\n  -> {tokenizer.decode(continuation)!r}")
        assert continuation == reference


# The GGUF holds SmolLM2 as Q4_1 (Q8_0 embedding): the exporter keeps those codes exactly (MatMulQ4 and
# MatMulQ8, d * q + m per block, see export/qweight.py). Plain re-rounding onto a second int4 grid gave
# only ~70% here.
ACCEPTANCE = 0.95


@pytest.mark.parametrize("activation_bits", [16, 8])
def test_the_ggufs_own_codes_agree_with_fp32_on_top1(activation_bits, passage_ids, fp32_passage_logits, report_figure):
    artifact = resolve_model(DEFAULT_MODEL, precision="int4", activation_bits=activation_bits, progress=False)
    manifest = load_manifest(artifact)
    assert manifest.weight_formats == {"Q4_1 (exact)": 210, "Q8_0 (exact)": 1}
    assert (manifest.weight_precision, manifest.lm_head_precision) == ("int4", "int8")
    assert manifest.activation_bits == activation_bits
    logits = teacher_forced(artifact, passage_ids)
    agreement = top1_agreement(logits, fp32_passage_logits)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(logits, fp32_passage_logits))
    positions = sum(map(len, passage_ids))
    figure = (
        f"SmolLM2 Q4_1 codes ({activation_bits}-bit activations) vs fp32: top-1 agreement {agreement:.1%} over "
        f"{positions} teacher-forced positions, max |logit diff| {diff:.2f}"
    )
    report_figure(figure)
    assert agreement >= ACCEPTANCE, figure
