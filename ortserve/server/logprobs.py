"""Logprobs in the two OpenAI formats, from the engine's per-token ``TokenLogprob``s
(``logprob`` of the sampled token, ``top_logprobs`` as (token id, logprob), most likely first)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ortserve.tokenizer import ChatPrompts

from .responses import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, PromptLogprob, PromptLogprobs, TopLogprob


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


def prompt_logprobs(prompts: ChatPrompts, prompt_ids: Sequence[int], entries: Sequence[Any]) -> PromptLogprobs:
    """vLLM's ``prompt_logprobs``: None for the first prompt token, then per token a dict keyed by
    token id holding the token itself and its top alternatives (rank 1 = most likely)."""
    out: PromptLogprobs = [None]
    for token_id, entry in zip(prompt_ids[1:], entries):
        row = {
            str(t): PromptLogprob(logprob=_finite(lp), rank=rank, decoded_token=prompts.token_text(t))
            for rank, (t, lp) in enumerate(entry.top_logprobs, start=1)
        }
        row[str(token_id)] = PromptLogprob(
            logprob=_finite(entry.logprob), rank=entry.rank, decoded_token=prompts.token_text(token_id)
        )
        out.append(row)
    return out


def echo_logprobs(prompts: ChatPrompts, prompt_ids: Sequence[int], entries: Sequence[Any]) -> CompletionLogprobs:
    """/v1/completions with echo: the prompt's tokens in the legacy format, the first with no
    logprob (nothing predicts it), as OpenAI's legacy API and vLLM answer."""
    first = prompts.token_text(prompt_ids[0]) if prompt_ids else ""
    out = CompletionLogprobs(text_offset=[0], token_logprobs=[None], tokens=[first], top_logprobs=[None])
    rest = completion_logprobs(prompts, prompt_ids[1:], entries, len(first))
    out.tokens += rest.tokens
    out.token_logprobs += rest.token_logprobs
    out.top_logprobs += rest.top_logprobs
    out.text_offset += rest.text_offset
    return out


def _finite(logprob: float) -> float:
    return max(logprob, -9999.0)  # JSON has no -inf
