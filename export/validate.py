"""Run an artifact with the engine's own model runner, and compare it with transformers.

``PagedRunner`` feeds flattened batches (prefill chunks and decodes mixed) through the engine's
``ModelRunner`` (one IOBinding, every layer's KV cache bound once as both input and output), over
a block pool handed out in shuffled order, so block tables are never contiguous. ``teacher_forced_logits`` and
``greedy_generate`` are built on it; ``transformers_logits`` is the reference, and the only place
in ``ortserve.export`` that imports torch.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ortserve.artifact import load_manifest


@dataclass
class _PagedSequence:
    """What the engine's model runner reads of a sequence."""

    token_ids: array
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    wants_prompt_logprobs: bool = False  # a logits row for each computed token (prompt logprobs)
    num_draft_tokens: int = 0  # speculative drafts (none here)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class PagedRunner:
    """An artifact run by the engine's own ``ModelRunner`` (the same inputs, IOBinding and
    in-place KV cache as serving), with sequences named by ids and a block pool handed out in
    shuffled order, so block tables are never contiguous."""

    def __init__(
        self,
        artifact: str | Path,
        *,
        block_size: int = 16,
        num_blocks: int = 64,
        threads: int = 0,
        seed: int = 0,
        options=None,
        kv_cache_dtype: str = "fp32",
    ):
        """``options``: an ``onnxruntime.SessionOptions`` to use (profiling, spinning); the op
        library is registered on it, and ``threads`` is then ignored. ``kv_cache_dtype``: fp32,
        fp16 or int8 cache rows."""
        from ortserve.engine.memory import KVCachePlan
        from ortserve.engine.model_runner import ModelRunner
        from ortserve.engine.threads import ThreadPlan

        self.manifest = m = load_manifest(artifact)
        per_block = m.kv_bytes_per_token(kv_cache_dtype) * block_size
        plan = KVCachePlan(num_blocks, block_size, per_block, per_block * num_blocks, kv_cache_dtype)
        cores = tuple(range(threads or os.cpu_count() or 1))
        self.runner = ModelRunner(Path(artifact), m, plan, ThreadPlan(cores, bind=False), 64, options)
        self.session = self.runner.session
        self.block_size = block_size
        self.free = [int(b) for b in np.random.default_rng(seed).permutation(num_blocks)]
        self.sequences: dict[int, _PagedSequence] = {}

    def step(self, batch: Sequence[tuple[int, Sequence[int]]], all_logits: bool = False) -> list[np.ndarray]:
        """Feed new tokens per sequence; returns per sequence logits [len(tokens), vocab] or [vocab]."""
        from ortserve.engine.scheduler import ScheduledBatch

        seqs = []
        for seq_id, tokens in batch:
            seq = self.sequences.setdefault(seq_id, _PagedSequence(array("q")))
            seq.num_computed_tokens = seq.num_tokens
            seq.token_ids.extend(tokens)
            while len(seq.block_table) * self.block_size < seq.num_tokens:
                if not self.free:
                    raise RuntimeError("PagedRunner ran out of KV blocks; pass a larger num_blocks")
                seq.block_table.append(self.free.pop())
            seqs.append(seq)
        counts = [len(tokens) for _, tokens in batch]
        logits = self.runner.execute(ScheduledBatch(seqs, counts, seqs), all_logits)  # type: ignore[arg-type]
        for seq in seqs:
            seq.num_computed_tokens = seq.num_tokens
        if not all_logits:
            return [logits[i].copy() for i in range(len(seqs))]
        bounds = np.cumsum([0, *counts])
        return [logits[bounds[i] : bounds[i + 1]].copy() for i in range(len(seqs))]

    def release(self, seq: int) -> None:
        sequence = self.sequences.pop(seq, None)
        if sequence is not None:
            self.free += sequence.block_table


def teacher_forced_logits(
    runner: PagedRunner,
    sequences: Sequence[Sequence[int]],
    prompt_lens: Sequence[int],
    *,
    prefill_chunk: int = 0,
    stagger: bool = False,
) -> list[np.ndarray]:
    """Logits at every position of each sequence: prompts prefilled (in chunks of ``prefill_chunk``
    if set), the rest decoded one token per step; with ``stagger`` sequence i joins at step i, so
    steps mix one sequence's prefill with another's decodes. Returns [len(seq), vocab] each."""
    cursors, results = [0] * len(sequences), [[] for _ in sequences]
    step = 0
    while any(c < len(s) for c, s in zip(cursors, sequences)):
        batch = []
        for i, seq in enumerate(sequences):
            if (stagger and i > step) or cursors[i] >= len(seq):
                continue
            remaining = prompt_lens[i] - cursors[i]
            count = (min(prefill_chunk, remaining) if prefill_chunk else remaining) if remaining > 0 else 1
            batch.append((i, seq[cursors[i] : cursors[i] + count]))
        for (i, tokens), logits in zip(batch, runner.step(batch, all_logits=True)):
            results[i].append(logits)
            cursors[i] += len(tokens)
        step += 1
    for i in range(len(sequences)):
        runner.release(i)
    return [np.concatenate(r) for r in results]


def greedy_generate(
    runner: PagedRunner, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int] = ()
) -> list[list[int]]:
    """Greedy continuations of all prompts, batched: one prefill step, then one decode step per token."""
    outputs: list[list[int]] = [[] for _ in prompts]
    logits = runner.step([(i, list(p)) for i, p in enumerate(prompts)])
    active = list(range(len(prompts)))
    for _ in range(max_new_tokens):
        for i, row in zip(active, logits):
            outputs[i].append(int(np.argmax(row)))
        active = [i for i in active if outputs[i][-1] not in stop_ids and len(outputs[i]) < max_new_tokens]
        if not active:
            break
        logits = runner.step([(i, [outputs[i][-1]]) for i in active])
    for i in range(len(prompts)):
        runner.release(i)
    return outputs


def transformers_logits(checkpoint: str | Path, sequences: Sequence[Sequence[int]]) -> list[np.ndarray]:
    """Reference logits [len(seq), vocab] from transformers' PyTorch model (fp32, eager attention)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()
    model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return [model(torch.tensor([list(s)])).logits[0].float().numpy() for s in sequences]


def top1_agreement(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    """Share of positions where two logit sets pick the same token."""
    same = sum(int((x.argmax(-1) == y.argmax(-1)).sum()) for x, y in zip(a, b))
    return same / sum(len(x) for x in a)


@dataclass(frozen=True)
class ValidationReport:
    max_abs_diff: float
    top1_agreement: float
    positions: int
    tolerance: float | None  # None: quantised weights, report only

    @property
    def ok(self) -> bool:
        return self.tolerance is None or self.max_abs_diff <= self.tolerance

    def summary(self) -> str:
        limit = f" (tolerance {self.tolerance:g})" if self.tolerance is not None else ""
        return (
            f"max |logit diff| {self.max_abs_diff:.2e} vs transformers fp32{limit}, "
            f"top-1 agreement {self.top1_agreement:.1%} over {self.positions} teacher-forced positions"
        )


def random_sequences(vocab_size: int, lengths: Sequence[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, n).tolist() for n in lengths]


PASSAGE = (
    "The river starts high in the mountains, where snow melts in the spring and runs down through "
    "narrow valleys. By the time it reaches the plain it is wide and slow, and farmers along its banks "
    "use the water for their fields. In the old town near the mouth of the river, a stone bridge has "
    "stood for more than four hundred years. People say it was built by a family of masons who spent "
    "their whole lives on it, and that the last stone was laid by the youngest daughter."
)


def text_sequences(artifact: str | Path, lengths: Sequence[int]) -> list[list[int]] | None:
    """Consecutive slices of an English passage, tokenised with the artifact's tokenizer.json
    (natural text makes top-1 agreement meaningful); None without a tokenizer."""
    path = Path(artifact) / "tokenizer.json"
    if not path.is_file():
        return None
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(path)).encode(PASSAGE).ids
    if len(ids) < sum(lengths):
        return None
    starts = np.cumsum([0, *lengths[:-1]])
    return [ids[s : s + n] for s, n in zip(starts, lengths)]


def validate_artifact(
    artifact: str | Path,
    checkpoint: str | Path,
    *,
    prompt_lens: Sequence[int] = (41, 23),
    decode_steps: int = 4,
    tolerance: float | None = 1e-3,
    seed: int = 0,
    block_size: int = 16,
) -> ValidationReport:
    """Two sequences of different lengths: prefill, then ``decode_steps`` decodes each, on shuffled
    blocks; logits at every position compared with transformers on the same tokens (slices of an
    English passage when the artifact has a tokenizer, else random tokens)."""
    manifest = load_manifest(artifact)
    lengths = [n + decode_steps for n in prompt_lens]
    sequences = text_sequences(artifact, lengths) or random_sequences(manifest.vocab_size, lengths, seed)
    runner = PagedRunner(artifact, block_size=block_size, seed=seed)
    ours = teacher_forced_logits(runner, sequences, prompt_lens)
    reference = transformers_logits(checkpoint, sequences)
    diff = max(float(np.abs(a - b).max()) for a, b in zip(ours, reference))
    return ValidationReport(diff, top1_agreement(ours, reference), sum(len(s) for s in sequences), tolerance)
