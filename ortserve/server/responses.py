"""Response bodies of the OpenAI API (and vLLM's /tokenize, /detokenize), as pydantic models."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, Field

OpenAIFinishReason = Literal["stop", "length", "tool_calls", "function_call"]


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def finish_reason(engine_reason: str | None, called: OpenAIFinishReason | None = None) -> OpenAIFinishReason | None:
    """The engine's stop/length/abort as OpenAI's stop/length (an aborted choice has no reader);
    ``called``: "tool_calls" (or legacy "function_call") when the choice stopped after calls."""
    if engine_reason is None:
        return None
    if engine_reason == "length":
        return "length"
    return called or "stop"


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int = 0) -> Usage:
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
        )


# --- /v1/completions ---------------------------------------------------------------------------


class CompletionLogprobs(BaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class PromptLogprob(BaseModel):
    """vLLM's prompt_logprobs entry for one alternative (keyed by token id)."""

    logprob: float
    rank: int | None = None
    decoded_token: str


PromptLogprobs = list[dict[str, PromptLogprob] | None]


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = None
    stop_reason: int | str | None = Field(None, description="The stop string or token id that ended it")
    prompt_logprobs: PromptLogprobs | None = Field(None, exclude_if=lambda v: v is None)


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


# --- /v1/chat/completions ----------------------------------------------------------------------


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


def _absent(value: object) -> bool:
    return value is None


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="The arguments object as JSON text")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] | None = Field(None, exclude_if=_absent)
    function_call: FunctionCall | None = Field(None, exclude_if=_absent, description="Legacy functions only")


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobs | None = Field(None, exclude_if=_absent)


class FunctionCallDelta(BaseModel):
    name: str | None = Field(None, exclude_if=_absent)
    arguments: str | None = Field(None, exclude_if=_absent)


class ToolCallDelta(BaseModel):
    """OpenAI's streamed call: the first delta of a call has id, type and name; later ones add
    to its arguments."""

    index: int
    id: str | None = Field(None, exclude_if=_absent)
    type: Literal["function"] | None = Field(None, exclude_if=_absent)
    function: FunctionCallDelta


class DeltaMessage(BaseModel):
    """Only what is new: the role in a choice's first chunk, then text or calls."""

    role: Literal["assistant"] | None = Field(None, exclude_if=_absent)
    content: str | None = Field(None, exclude_if=_absent)
    tool_calls: list[ToolCallDelta] | None = Field(None, exclude_if=_absent)
    function_call: FunctionCallDelta | None = Field(None, exclude_if=_absent)


class ChatChunkChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: OpenAIFinishReason | None = None
    stop_reason: int | str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


# --- models, tokenizer ------------------------------------------------------------------------


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "ortserve"
    root: str | None = Field(None, description="The artifact directory")
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str
