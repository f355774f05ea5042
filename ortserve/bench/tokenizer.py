"""The tokenizer the bench counts with: a local HF tokenizer directory.

With a tokenizer.json it is loaded by the `tokenizers` library alone (fast to import); otherwise
through transformers' AutoTokenizer. Both answer the same three calls.
"""

from __future__ import annotations

from pathlib import Path


class Tokenizer:
    def __init__(self, backend, vocab_size: int):
        self._backend = backend  # a tokenizers.Tokenizer or a transformers tokenizer
        self.vocab_size = vocab_size

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids without special tokens (a server may add a BOS of its own)."""
        if hasattr(self._backend, "encode_batch"):
            return [e.ids for e in self._backend.encode_batch(texts, add_special_tokens=False)]
        return self._backend(texts, add_special_tokens=False)["input_ids"]

    def count(self, text: str) -> int:
        return len(self.encode_batch([text])[0])

    def decode_batch(self, ids: list[list[int]]) -> list[str]:
        if hasattr(self._backend, "decode_batch"):
            return self._backend.decode_batch(ids, skip_special_tokens=False)
        return self._backend.batch_decode(ids)

    def decode(self, ids: list[int]) -> str:
        return self.decode_batch([ids])[0]


def load_tokenizer(path: str | Path) -> Tokenizer:
    path = Path(path)
    if not path.is_dir():
        raise SystemExit(f"--tokenizer {path}: not a directory; pass a local HF tokenizer dir (tokenizer.json...)")
    if (path / "tokenizer.json").is_file():
        from tokenizers import Tokenizer as FastTokenizer

        backend = FastTokenizer.from_file(str(path / "tokenizer.json"))
        return Tokenizer(backend, backend.get_vocab_size(with_added_tokens=True))
    from transformers import AutoTokenizer

    backend = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return Tokenizer(backend, len(backend))
