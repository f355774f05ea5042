"""Prompts: the artifact's tokenizer, its chat template, and the length check.

Runs in the HTTP process, so the engine never spends a cycle on text. The chat template is the
artifact's own, applied with transformers' ``apply_chat_template``.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from .errors import BadRequest
from .protocol import ChatMessage


def block_torch_import() -> None:
    """Make ``import torch`` fail in this process (transformers then loads tokenizers only).
    The serving process must not pay torch's import time and memory; call before transformers."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # the import system's "not found"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner


def load_tokenizer(artifact_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(artifact_dir)


class Prompts:
    """Turns request prompts into token ids, and token ids back into text."""

    def __init__(self, tokenizer: Any, max_model_len: int, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        self.token_text = lru_cache(maxsize=65536)(self._token_text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def _token_text(self, token_id: int) -> str:
        """One token as text, for logprobs (a lone byte of a multi-byte character stays as the
        replacement character, as vLLM and OpenAI do)."""
        return self.tokenizer.decode([token_id])

    def check_ids(self, token_ids: Sequence[int], field: str) -> list[int]:
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise BadRequest(f"'{field}' holds token id {bad}, outside the vocabulary "
                             f"[0, {self.vocab_size})", field)
        return list(token_ids)

    def render_chat(self, messages: list[ChatMessage], add_generation_prompt: bool,
                    continue_final_message: bool = False,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise BadRequest("this model has no chat template; use /v1/completions", "messages")
        conversation = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()}
                        for m in messages]
        if continue_final_message and conversation[-1]["role"] != "assistant":
            raise BadRequest("'continue_final_message' needs the last message to be the "
                             "assistant's", "continue_final_message")
        try:
            text = self.tokenizer.apply_chat_template(
                conversation, tokenize=False, add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message, **(template_kwargs or {}))
        except Exception as exc:  # jinja raises on conversations the template refuses
            raise BadRequest(f"the chat template refused 'messages': {exc}", "messages") from exc
        # The template already wrote the special tokens (BOS, role markers).
        return self.encode(text, add_special_tokens=False)

    def max_tokens_for(self, prompt_len: int, requested: int | None, default: int | None,
                       prompt_field: str) -> int:
        """The completion budget for a prompt, or a 400 naming the field that is too long."""
        limit = self.max_model_len
        if prompt_len == 0:
            raise BadRequest(f"'{prompt_field}' is empty after tokenisation", prompt_field)
        if prompt_len >= limit:
            raise BadRequest(
                f"'{prompt_field}' is too long: {prompt_len} tokens, and this model's maximum "
                f"context length is {limit} tokens (prompt + completion; --max-model-len)",
                prompt_field)
        room = limit - prompt_len
        if requested is not None:
            if requested > room:
                raise BadRequest(
                    f"'max_tokens' is too large: {requested} completion tokens + {prompt_len} "
                    f"prompt tokens exceed this model's maximum context length of {limit} "
                    f"tokens; at most {room} fit", "max_tokens")
            return requested
        return room if default is None else min(default, room)
