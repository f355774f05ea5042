"""Logprobs in the two OpenAI formats, from the engine's per-token ``TokenLogprob``s
(``logprob`` of the sampled token, ``top_logprobs`` as (token id, logprob), most likely first)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ortserve.tokenizer import ChatPrompts

from .responses import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob


def completion_logprobs(
    prompts: ChatPrompts, token_ids: Sequence[int], logprobs: Sequence[Any], text_offset: int = 0
) -> CompletionLogprobs:
    """/v1/completions: parallel lists; ``top_logprobs`` maps token text -> logprob and always
    holds the sampled token. ``text_offset`` is where the first token starts in the choice text."""
    out = CompletionLogprobs()
    for token_id, entry in zip(token_ids, logprobs):
        text = prompts.token_text(token_id)
        top = {prompts.token_text(t): lp for t, lp in entry.top_logprobs}
        top.setdefault(text, entry.logprob)
        out.tokens.append(text)
        out.token_logprobs.append(entry.logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(text_offset)
        text_offset += len(text)
    return out


def chat_logprobs(prompts: ChatPrompts, token_ids: Sequence[int], logprobs: Sequence[Any]) -> ChatLogprobs:
    """/v1/chat/completions: one entry per token with its own top_logprobs list."""
    content = []
    for token_id, entry in zip(token_ids, logprobs):
        top = [_top(prompts, t, lp) for t, lp in entry.top_logprobs]
        sampled = _top(prompts, token_id, entry.logprob)
        content.append(
            ChatTokenLogprob(token=sampled.token, logprob=sampled.logprob, bytes=sampled.bytes, top_logprobs=top)
        )
    return ChatLogprobs(content=content)


def _top(prompts: ChatPrompts, token_id: int, logprob: float) -> TopLogprob:
    text = prompts.token_text(token_id)
    return TopLogprob(token=text, logprob=max(logprob, -9999.0), bytes=list(text.encode()))
