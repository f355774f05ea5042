"""Benchmark prompts of exact token lengths.

Prompts are runs of whole-word vocabulary tokens (" river", " table", ...): each one is a single
token that the tokenizer encodes back to itself, and a leading space makes it its own
pre-token, so a run of n of them re-encodes to exactly n tokens. A tokenizer without such
tokens falls back to random ids, decoded, re-encoded and trimmed until the length fits.

- random: every prompt is input_len fresh random tokens.
- shared-prefix: every prompt starts with one of num_prefixes fixed prefixes of prefix_len tokens
  and ends with input_len - prefix_len random ones, so a server with prefix caching skips most
  of the prefill after the first request of each prefix.
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
