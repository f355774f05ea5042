"""Request bodies of the OpenAI API, as pydantic models (the OpenAPI schema comes from these).

Range checks live in ``Field`` so a bad value is a 400 naming the field before any work is
done; checks that span fields are in ``check()``. Unknown fields are ignored, as OpenAI's SDKs
send ``extra_body`` entries at the top level.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from .errors import BadRequest

MAX_LOGPROBS = 20

TokenIds = list[Annotated[int, Field(ge=0)]]


class StreamOptions(BaseModel):
    include_usage: bool = Field(False, description="Send a last chunk with the request's usage")
    continuous_usage_stats: bool = Field(False, description="Put usage on every chunk")


class SamplingRequest(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(extra="ignore")

    model: str | None = Field(None, description="Served model name; defaults to the only model")
    n: int = Field(1, ge=1, le=128, description="Choices to generate for each prompt")
    max_tokens: int | None = Field(None, ge=1, description="Most tokens to generate per choice")
    min_tokens: int = Field(0, ge=0, description="Tokens to generate before EOS or stop may end")
    ignore_eos: bool = Field(False, description="Keep generating past the EOS token")
    temperature: float = Field(1.0, ge=0, description="0 = greedy")
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1, description="0 or -1 = off")
    min_p: float = Field(0.0, ge=0, le=1)
    seed: int | None = Field(None, description="Per-request seed for reproducible sampling")
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = Field(
        None, description="Token id (as a string) -> bias added to its logit")
    stop: str | list[str] | None = Field(None, description="Strings that end a choice")
    stop_token_ids: TokenIds | None = Field(None, description="Token ids that end a choice")
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = Field(None, description="End-user id (accepted, not used)")

    def check(self, vocab_size: int) -> None:
        """Cross-field checks; raises BadRequest naming the field."""
        if self.stream_options is not None and not self.stream:
            raise BadRequest("'stream_options' is only allowed when 'stream' is true",
                             "stream_options")
        if self.stop_token_ids:
            _check_ids(self.stop_token_ids, vocab_size, "stop_token_ids")
        for key in self.logit_bias or {}:
            if not key.lstrip("-").isdigit() or not 0 <= int(key) < vocab_size:
                raise BadRequest(f"'logit_bias' key {key!r} is not a token id in "
                                 f"[0, {vocab_size})", "logit_bias")

    def stop_list(self) -> list[str] | None:
        if self.stop is None:
            return None
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s] or None

    def sampling_kwargs(self) -> dict[str, Any]:
        """The SamplingParams fields both endpoints set the same way."""
        return dict(
            n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            min_p=self.min_p, seed=self.seed, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, repetition_penalty=self.repetition_penalty,
            logit_bias={int(k): v for k, v in self.logit_bias.items()} if self.logit_bias else None,
            stop=self.stop_list(), stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output,
            min_tokens=self.min_tokens, ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
        )


def _check_ids(ids: list[int], vocab_size: int, field: str) -> None:
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"'{field}' holds token id {bad[0]}, outside the vocabulary "
                         f"[0, {vocab_size})", field)


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    prompt: str | list[str] | TokenIds | list[TokenIds] = Field(
        description="A string, a list of strings, token ids, or a list of token-id lists")
    echo: bool = Field(False, description="Put the prompt before the generated text")
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                 description="Alternatives to return per token (0 = sampled only)")
    suffix: str | None = Field(None, description="Not supported")

    def check(self, vocab_size: int) -> None:
        super().check(vocab_size)
        if self.suffix:
            raise BadRequest("'suffix' is not supported", "suffix")
        if self.echo and self.logprobs is not None:
            raise BadRequest("'echo' with 'logprobs' would need prompt logprobs, which this "
                             "server does not compute", "echo")
        if isinstance(self.prompt, list) and not self.prompt:
            raise BadRequest("'prompt' must not be empty", "prompt")

    def prompts(self) -> list[str] | list[list[int]]:
        """The batch of prompts: strings or token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return p  # type: ignore[return-value]


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(SamplingRequest):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = Field(True, description="End the prompt with the assistant's turn")
    continue_final_message: bool = Field(False, description="Continue the last assistant message")
    max_completion_tokens: int | None = Field(None, ge=1, description="Alias of max_tokens")
    logprobs: bool = Field(False, description="Return the sampled tokens' logprobs")
    top_logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS,
                                     description="Alternatives per token; needs logprobs=true")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="Extra template variables")
    response_format: dict[str, Any] | None = Field(None, description="Only {'type': 'text'}")
    tools: list[dict[str, Any]] | None = Field(None, description="Not supported (400 unless "
                                                                 "tool_choice='none')")
    tool_choice: str | dict[str, Any] | None = None

    def check(self, vocab_size: int) -> None:
        super().check(vocab_size)
        if self.top_logprobs and not self.logprobs:
            raise BadRequest("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise BadRequest("'response_format' other than {'type': 'text'} is not supported",
                             "response_format")
        if self.tools and self.tool_choice != "none":
            raise BadRequest("tool calling is not supported; drop 'tools' or set tool_choice 'none'",
                             "tools")
        if self.continue_final_message and self.add_generation_prompt:
            raise BadRequest("'continue_final_message' needs 'add_generation_prompt' false",
                             "continue_final_message")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None


class TokenizeRequest(BaseModel):
    """POST /tokenize: either a prompt or chat messages."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = Field(True, description="Only for 'prompt'; chat templates add their own")

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise BadRequest("give exactly one of 'prompt' and 'messages'", "prompt")
        if self.messages is not None and not self.messages:
            raise BadRequest("'messages' must not be empty", "messages")


class DetokenizeRequest(BaseModel):
    model: str | None = None
    tokens: TokenIds
