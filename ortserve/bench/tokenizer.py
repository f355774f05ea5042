"""The tokenizer the bench counts with: a local HF tokenizer directory, loaded by the project's
one tokenizer loader (``ortserve.tokenizer``), with the batch calls the bench makes."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class BenchTokenizer:
    def __init__(self, backend: Any):
        self._backend = backend  # a transformers tokenizer
        self.vocab_size = len(backend)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids without special tokens (a server may add a BOS of its own)."""
        return [list(ids) for ids in self._backend(texts, add_special_tokens=False)["input_ids"]]

    def count(self, text: str) -> int:
        return len(self.encode_batch([text])[0])

    def decode_batch(self, ids: list[list[int]]) -> list[str]:
        return list(self._backend.batch_decode(ids))

    def decode(self, ids: list[int]) -> str:
        return self.decode_batch([ids])[0]

    def chat_prompt(self, user_message: str) -> str:
        """One user turn through the model's chat template, ready for the assistant's answer."""
        from ortserve.tokenizer import ChatPrompts

        return ChatPrompts(self._backend).render_chat([{"role": "user", "content": user_message}])


def bench_tokenizer(path: str | Path) -> BenchTokenizer:
    from ortserve.tokenizer import load_tokenizer

    path = Path(path)
    if not path.is_dir():
        raise SystemExit(f"--tokenizer {path}: not a directory; pass a local HF tokenizer dir (tokenizer.json...)")
    return BenchTokenizer(load_tokenizer(path))
