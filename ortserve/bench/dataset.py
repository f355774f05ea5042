"""Benchmark prompts of exact token lengths.

Prompts are runs of whole-word vocabulary tokens (" river", " table", ...): each one is a single
token that the tokenizer encodes back to itself, and a leading space makes it its own
pre-token, so a run of n of them re-encodes to exactly n tokens. A tokenizer without such
tokens falls back to random ids, decoded, re-encoded and trimmed until the length fits.

- random: every prompt is input_len fresh random tokens.
- shared-prefix: every prompt starts with one of num_prefixes fixed prefixes of prefix_len tokens
  and ends with input_len - prefix_len random ones, so a server with prefix caching skips most
  of the prefill after the first request of each prefix.
- grounded: an instruction to copy or correct a passage of plain English (sentences of
  ``PASSAGE_SENTENCES`` in a random order, about input_len tokens), through the model's chat
  template: the answer repeats the prompt, as summaries, edits and extraction do, which is where
  prompt-lookup speculative decoding pays. The model stops on its own (no ignore_eos).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ortserve.bench.tokenizer import BenchTokenizer, bench_tokenizer  # noqa: F401  (re-exported)


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int  # tokens, counted without special tokens (a server may add a BOS)
    output_len: int


class PromptMaker:
    """Turns (length, rng) into a prompt string of exactly that many tokens."""

    def __init__(self, tokenizer: BenchTokenizer):
        self.tokenizer = tokenizer
        self.words = self._word_tokens()

    def _encode(self, texts: list[str]) -> list[list[int]]:
        return self.tokenizer.encode_batch(texts)

    def _word_tokens(self) -> np.ndarray:
        ids = list(range(self.tokenizer.vocab_size))
        texts = self.tokenizer.decode_batch([[i] for i in ids])
        candidates = [
            (i, t)
            for i, t in zip(ids, texts)
            if len(t) >= 3 and t[0] == " " and t[1:].isascii() and t[1:].isalpha() and len(t) <= 13
        ]
        encoded = self._encode([t for _, t in candidates]) if candidates else []
        return np.array([i for (i, _), e in zip(candidates, encoded) if e == [i]], dtype=np.int64)

    def tokens(self, n: int, rng: np.random.Generator) -> list[int]:
        pool = self.words if len(self.words) >= 64 else np.arange(self.tokenizer.vocab_size)
        return rng.choice(pool, size=n).tolist()

    def text(self, token_ids: list[int], rng: np.random.Generator) -> tuple[str, int]:
        """Decode token_ids and repair the text until it re-encodes to len(token_ids) tokens."""
        target = len(token_ids)
        text = self.tokenizer.decode(token_ids)
        for _ in range(10):
            ids = self._encode([text])[0]
            if len(ids) == target:
                break
            ids = ids[:target] if len(ids) > target else ids + self.tokens(target - len(ids), rng)
            text = self.tokenizer.decode(ids)
        return text, len(self._encode([text])[0])


PASSAGE_SENTENCES = (
    "The ferry leaves the harbour at seven and returns before the evening light fades.",
    "Most of the village works on the farms that climb the hills behind the church.",
    "A narrow road follows the river past the mill and the old stone bridge.",
    "In winter the lake freezes, and children skate on it after school.",
    "The library opens late on Thursdays so that workers can borrow books after their shifts.",
    "Every spring the orchard is white with blossom for a week, then green for the rest of the year.",
    "The station master keeps a clock that has not missed a minute in forty years.",
    "Fishing boats come in at noon, and the market sells their catch until it is gone.",
    "On market days the square fills with stalls of bread, cheese, honey and wool.",
    "The school has three classrooms, a small garden and a bell that rings at nine.",
    "After the storm the beach was covered with seaweed, driftwood and broken shells.",
    "The baker starts work at four so that the first loaves are ready by six.",
)
INSTRUCTIONS = (
    "Repeat the following text exactly, word for word:",
    "Correct the spelling mistakes in the following text and return the whole text:",
)


def grounded_requests(
    tokenizer: BenchTokenizer, num: int, input_len: int, output_len: int, seed: int
) -> list[SampleRequest]:
    """Chat-formatted prompts asking to copy or correct a passage of about input_len tokens."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(num):
        sentences: list[str] = []
        while tokenizer.count(" ".join(sentences)) < input_len:
            sentences.append(PASSAGE_SENTENCES[int(rng.integers(len(PASSAGE_SENTENCES)))])
        passage = " ".join(sentences)
        instruction = INSTRUCTIONS[i % len(INSTRUCTIONS)]
        if i % len(INSTRUCTIONS):  # a few misspellings for the model to fix
            passage = passage.replace("the ", "teh ", 2).replace("which", "wich")
        prompt = tokenizer.chat_prompt(f"{instruction}\n\n{passage}")
        out.append(SampleRequest(prompt, tokenizer.count(prompt), output_len))
    return out


def random_requests(maker: PromptMaker, num: int, input_len: int, output_len: int, seed: int) -> list[SampleRequest]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(num):
        text, n = maker.text(maker.tokens(input_len, rng), rng)
        out.append(SampleRequest(text, n, output_len))
    return out


def shared_prefix_requests(
    maker: PromptMaker, num: int, input_len: int, output_len: int, prefix_len: int, num_prefixes: int, seed: int
) -> list[SampleRequest]:
    if not 0 < prefix_len <= input_len:
        raise SystemExit(f"--prefix-len {prefix_len} must be in 1..--input-len ({input_len})")
    rng = np.random.default_rng(seed)
    prefixes = [maker.tokens(prefix_len, rng) for _ in range(max(1, num_prefixes))]
    out = []
    for i in range(num):
        ids = prefixes[i % len(prefixes)] + maker.tokens(input_len - prefix_len, rng)
        text, n = maker.text(ids, rng)
        out.append(SampleRequest(text, n, output_len))
    return out
