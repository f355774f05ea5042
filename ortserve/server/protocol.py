"""Request bodies of the OpenAI API, as pydantic models (the OpenAPI schema comes from these).

Every numeric and size bound comes from ``ortserve.sampling_params.BOUNDS`` (``bounded``), the
one table that ``SamplingParams`` also checks, so HTTP and offline accept the same inputs and the
OpenAPI schema declares each bound the server enforces. Checks that span fields are in
``check()`` and, where JSON Schema can say them, in the model's schema too.

Nothing is silently ignored. Every declared field is honoured, or refused with a 400 naming it
when given a value the server cannot honour (``suffix``, ``prediction``, ``modalities`` other than
text). An unknown top-level field is a 400 naming it, unless the server runs with
``--allow-extra-fields`` (for clients that send extras): then unknown fields are ignored and the
OpenAPI schema says so (``additionalProperties``). Inside nested objects unknown keys are ignored,
as OpenAI's SDKs send back whole response messages (``refusal``, ``annotations``...).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from ortserve.sampling_params import BOUNDS

from .errors import BadRequest
from .responses import FunctionCall, ToolCall
from .schema_rules import (
    CHAT_TOOL_RULES,
    CONSTRAINS_OUTPUT,
    STREAM_OPTIONS_NEED_STREAM,
    at_least,
    at_most_one,
    requires,
)
from .structured import Choice, GrammarText, RegexText, ResponseFormat, Schema, StructuredOutputsRequest
from .tools import FunctionCallChoice, Functions, ToolChoice, Tools, arguments_value

MAX_PROMPT_CHARS = 500_000  # per prompt or message: bounds tokenisation work before it starts
MAX_PROMPT_TOKENS = 1_000_000  # per token-id prompt
MAX_BATCH = 256  # prompts in one /v1/completions request
MAX_MESSAGES = 1024
MAX_TEMPLATE_CHARS = 65_536


def bounded(name: str, default: Any = None, **kwargs: Any) -> Any:
    """A pydantic Field whose constraints are ``BOUNDS[name]``."""
    return Field(default, **BOUNDS[name].field_kwargs(), **kwargs)


def _integral(value: Any) -> Any:
    """JSON Schema's integer: 36686.0 is one (and becomes 36686); 1.5, true and "5" are not."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def bounded_int(name: str) -> Any:
    """An integer within ``BOUNDS[name]`` that also takes JSON's 5.0 for 5."""
    return Annotated[int, Field(**BOUNDS[name].field_kwargs()), BeforeValidator(_integral)]


# The OpenAPI schema narrows these to the loaded model's vocabulary (openapi.py reads the marks).
TOKEN_ID_MARK, TOKEN_ID_KEYS_MARK = "x-token-id", "x-token-id-keys"
TokenId = Annotated[
    int,
    Field(**BOUNDS["token_id"].field_kwargs(), json_schema_extra={TOKEN_ID_MARK: True}),
    BeforeValidator(_integral),
]
Choices = bounded_int("n")
TokenCount = bounded_int("max_tokens")
MinTokens = bounded_int("min_tokens")
TopK = bounded_int("top_k")
Seed = bounded_int("seed")
LogprobCount = bounded_int("logprobs")
TOKEN_ID_KEY = r"^(0|[1-9][0-9]{0,8})$"  # as sampling_params reads logit_bias keys
LogitBias = Annotated[
    dict[
        Annotated[str, Field(pattern=TOKEN_ID_KEY)],
        Annotated[float, Field(**BOUNDS["logit_bias_value"].field_kwargs())],
    ],
    Field(**BOUNDS["logit_bias"].field_kwargs()),
    WithJsonSchema(
        {
            "type": "object",
            TOKEN_ID_KEYS_MARK: True,
            "maxProperties": BOUNDS["logit_bias"].max_items,
            "additionalProperties": False,
            "patternProperties": {
                TOKEN_ID_KEY: {
                    "type": "number",
                    "minimum": BOUNDS["logit_bias_value"].ge,
                    "maximum": BOUNDS["logit_bias_value"].le,
                }
            },
        }
    ),
]
TokenIds = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_PROMPT_TOKENS)]
PromptText = Annotated[str, Field(min_length=1, max_length=MAX_PROMPT_CHARS)]
ContentText = Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
STRICT = ConfigDict(extra="ignore", strict=True)  # 1 is not true, "5" is not 5: as the schema says
StopString = Annotated[str, Field(max_length=BOUNDS["stop"].max_length)]


class StreamOptions(BaseModel):
    model_config = STRICT

    include_usage: bool = Field(False, description="Send a last chunk with the request's usage")
    continuous_usage_stats: bool = Field(False, description="Put usage on every chunk")


class RequestModel(BaseModel):
    """A request body. Unknown top-level fields are kept aside (``model_extra``) so that the
    server refuses them by name, or ignores them with --allow-extra-fields."""

    model_config = ConfigDict(extra="allow", strict=True)

    def check_fields(self, allow_extra: bool) -> None:
        unknown = sorted(self.model_extra or {})
        if unknown and not allow_extra:
            names = ", ".join(f"'{name}'" for name in unknown)
            raise BadRequest(
                f"Unknown field{'s' if len(unknown) > 1 else ''} {names}: this server does not support "
                f"{'them' if len(unknown) > 1 else 'it'}. Remove {'them' if len(unknown) > 1 else 'it'}, or "
                f"start the server with --allow-extra-fields to have unknown fields ignored",
                unknown[0],
            )


ONLY_FALSE = WithJsonSchema({"anyOf": [{"const": False}, {"type": "null"}], "description": "Only false"})
EndUserId = Annotated[str, Field(max_length=256)]


class CallerFields(BaseModel):
    """What OpenAI's newer clients send about the caller rather than the generation (chat and
    responses), honoured as a server with one service tier that stores nothing."""

    safety_identifier: EndUserId | None = Field(None, description="End-user id (after 'user'), in the request log")
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = Field(
        None, description="Accepted: every request shares one prefix cache, with no key needed"
    )
    service_tier: Literal["auto", "default"] | None = Field(None, description="Only 'auto' or 'default': one tier")
    store: Annotated[bool | None, ONLY_FALSE] = Field(None, description="Only false: nothing is stored")

    def check_nothing_stored(self, what: str) -> None:
        if self.store:
            raise BadRequest(f"'store' is not supported: this server stores no {what}; omit it or send false", "store")


class SamplingRequest(RequestModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(
        extra="allow",
        strict=True,
        json_schema_extra={"allOf": [STREAM_OPTIONS_NEED_STREAM]},
    )

    model: str | None = Field(None, description="Served model name; defaults to the only model")
    n: Choices = Field(1, description="Choices to generate for each prompt")
    max_tokens: TokenCount | None = Field(None, description="Most tokens to generate per choice")
    min_tokens: MinTokens = Field(
        0, description="Tokens to generate before EOS or stop may end a choice (max_tokens still ends it)"
    )
    ignore_eos: bool = Field(False, description="Keep generating past the EOS token")
    temperature: float = bounded("temperature", 1.0, description="0 = greedy")
    top_p: float = bounded("top_p", 1.0)
    top_k: TopK = Field(0, description="0 or -1 = off")
    min_p: float = bounded("min_p", 0.0)
    seed: Seed | None = Field(None, description="Per-request seed for reproducible sampling")
    presence_penalty: float = bounded("presence_penalty", 0.0)
    frequency_penalty: float = bounded("frequency_penalty", 0.0)
    repetition_penalty: float = bounded("repetition_penalty", 1.0)
    logit_bias: LogitBias | None = Field(None, description="Token id (as a decimal string) -> bias added to its logit")
    stop: StopString | Annotated[list[StopString], Field(max_length=BOUNDS["stop"].max_items)] | None = Field(
        None, description="Strings that end a choice"
    )
    stop_token_ids: Annotated[list[TokenId], Field(max_length=BOUNDS["stop_token_ids"].max_items)] | None = Field(
        None, description="Token ids that end a choice"
    )
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: EndUserId | None = Field(None, description="End-user id, in the request log")
    prompt_logprobs: LogprobCount | None = Field(
        None, description="Logprobs of each prompt token and its top k alternatives (vLLM); the prompt is recomputed"
    )
    truncate_prompt_tokens: bounded_int("truncate_prompt_tokens") | None = Field(  # type: ignore[valid-type]
        None, description="Keep only the prompt's last k tokens"
    )
    response_format: ResponseFormat | None = Field(None, description="text, json_object, or json_schema")
    structured_outputs: StructuredOutputsRequest | None = Field(None, description="vLLM's structured outputs")
    guided_json: Schema | None = Field(None, description="A JSON schema (vLLM's older spelling)")
    guided_regex: RegexText | None = Field(None, description="A regular expression (vLLM's older spelling)")
    guided_choice: Choice | None = Field(None, description="One of these strings (vLLM's older spelling)")
    guided_grammar: GrammarText | None = Field(None, description="A Lark or GBNF grammar (vLLM's older spelling)")

    def check(self) -> None:
        """Cross-field checks; raises BadRequest naming the field. (Bounds that need the model
        are ``PromptLimits``'s, the same offline and over HTTP.)"""
        if self.stream_options is not None and not self.stream:
            raise BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options")

    def stop_list(self) -> list[str] | None:
        if self.stop is None:
            return None
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        return [s for s in stops if s] or None

    def sampling_kwargs(self) -> dict[str, Any]:
        """The SamplingParams fields both endpoints set the same way."""
        return dict(
            n=self.n,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            min_p=self.min_p,
            seed=self.seed,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty,
            logit_bias=dict(self.logit_bias) if self.logit_bias else None,
            stop=self.stop_list(),
            stop_token_ids=list(self.stop_token_ids or []),
            include_stop_str_in_output=self.include_stop_str_in_output,
            min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos,
            skip_special_tokens=self.skip_special_tokens,
            truncate_prompt_tokens=self.truncate_prompt_tokens,
            output_kind="delta" if self.stream else "final_only",  # a response waits for the end
        )


class CompletionRequest(SamplingRequest):
    """POST /v1/completions."""

    model_config = ConfigDict(
        extra="allow",
        strict=True,
        json_schema_extra={
            "allOf": [
                STREAM_OPTIONS_NEED_STREAM,
                *at_most_one(CONSTRAINS_OUTPUT),
                {
                    "not": {
                        "properties": {"stream": {"const": True}, "best_of": {"type": "integer", "minimum": 2}},
                        "required": ["stream", "best_of"],
                    }
                },
                at_least("best_of", "n", BOUNDS["n"].le),
            ]
        },
    )

    prompt: (
        PromptText
        | Annotated[list[PromptText], Field(min_length=1, max_length=MAX_BATCH)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_BATCH)]
    ) = Field(description="A string, a list of strings, token ids, or a list of token-id lists")
    echo: bool = Field(False, description="Put the prompt before the generated text (and its logprobs)")
    logprobs: LogprobCount | None = Field(None, description="Alternatives to return per token (0 = sampled only)")
    best_of: Choices | None = Field(
        None, description="Generate this many and return the n with the highest cumulative logprob (not streamed)"
    )
    suffix: Annotated[str | None, WithJsonSchema({"type": "null", "description": "Not supported: omit it"})] = None

    def check(self) -> None:
        super().check()
        if self.suffix is not None:
            raise BadRequest(
                "'suffix' is not supported (no fill-in-the-middle): omit it, and end 'prompt' where the completion "
                "should start",
                "suffix",
            )
        if isinstance(self.prompt, list) and not self.prompt:
            raise BadRequest("'prompt' must not be empty", "prompt")
        if self.best_of is not None and self.best_of < self.n:
            raise BadRequest(f"'best_of' ({self.best_of}) must be at least 'n' ({self.n})", "best_of")
        if self.best_of is not None and self.best_of > 1 and self.stream:
            raise BadRequest("'best_of' cannot be streamed: the best choices are known only at the end", "best_of")

    def echo_logprobs(self) -> int | None:
        """Prompt logprobs to ask of the engine: vLLM's prompt_logprobs, or echo with logprobs."""
        if self.prompt_logprobs is not None:
            return max(self.prompt_logprobs, self.logprobs or 0) if self.echo else self.prompt_logprobs
        return self.logprobs if self.echo else None

    def prompts(self) -> list[str] | list[list[int]]:
        """The batch of prompts: strings or token-id lists."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return p  # type: ignore[return-value]


def check_text_part(part: Any, kinds: tuple[str, ...]) -> Any:
    """A content part of another type (an image, audio, a file) is refused by saying that the model
    reads text, rather than by pydantic's "Input should be 'text'"."""
    kind = part.get("type") if isinstance(part, dict) else None
    if isinstance(kind, str) and kind not in kinds:
        example = f'{{"type": "{kinds[0]}", "text": ...}}'
        raise ValueError(
            f"content parts of type '{kind}' are not supported: the served model reads text only; "
            f"send the content as a string or as parts of type '{kinds[0]}' ({example})"
        )
    return part


class TextPart(BaseModel):
    model_config = STRICT

    type: Literal["text"]
    text: ContentText

    @model_validator(mode="before")
    @classmethod
    def text_only(cls, part: Any) -> Any:
        return check_text_part(part, ("text",))


class ChatMessage(BaseModel):
    model_config = STRICT

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: ContentText | Annotated[list[TextPart], Field(max_length=MAX_MESSAGES)] | None = None
    name: Annotated[str, Field(max_length=256)] | None = Field(
        None, description="A participant's name, for the template"
    )
    tool_calls: Annotated[list[ToolCall], Field(max_length=MAX_MESSAGES)] | None = Field(
        None, description="An assistant's past calls"
    )
    tool_call_id: Annotated[str, Field(max_length=256)] | None = Field(None, description="A tool result's call")
    function_call: FunctionCall | None = Field(None, description="An assistant's past call (legacy functions)")

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""

    def conversation_entry(self) -> dict[str, Any]:
        """The message as chat templates take it (developer = system, as OpenAI; a legacy
        function result is a tool message; arguments as objects, as transformers passes them)."""
        role = {"developer": "system", "function": "tool"}.get(self.role, self.role)
        entry: dict[str, Any] = {"role": role, "content": self.text()}
        if self.name is not None:
            entry["name"] = self.name
        calls = list(self.tool_calls or [])
        if self.function_call is not None:
            calls.append(ToolCall(id=f"call_{len(calls)}", function=self.function_call))
        if calls and role == "assistant":
            entry["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": arguments_value(c.function.arguments)},
                }
                for c in calls
            ]
        if self.tool_call_id is not None and role == "tool":
            entry["tool_call_id"] = self.tool_call_id
        return entry


class ChatCompletionRequest(SamplingRequest, CallerFields):
    """POST /v1/chat/completions."""

    model_config = ConfigDict(
        extra="allow",
        strict=True,
        json_schema_extra={
            "allOf": [
                STREAM_OPTIONS_NEED_STREAM,
                *at_most_one(CONSTRAINS_OUTPUT),
                requires("top_logprobs", {"type": "integer", "minimum": 1}, "logprobs", True),
                requires("continue_final_message", {"const": True}, "add_generation_prompt", False),
                *CHAT_TOOL_RULES,
            ]
        },
    )

    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    add_generation_prompt: bool = Field(True, description="End the prompt with the assistant's turn")
    continue_final_message: bool = Field(False, description="Continue the last message (an assistant's, usually)")
    echo: bool = Field(
        False, description="Start the answer with the last message's content when it is the assistant's (vLLM)"
    )
    max_completion_tokens: TokenCount | None = Field(None, description="Alias of max_tokens")
    logprobs: bool = Field(False, description="Return the sampled tokens' logprobs")
    top_logprobs: LogprobCount | None = Field(None, description="Alternatives per token; needs logprobs=true")
    chat_template_kwargs: dict[str, Any] | None = Field(None, description="Extra template variables")
    chat_template: str | None = Field(
        None,
        max_length=MAX_TEMPLATE_CHARS,
        description="A template replacing the model's; refused unless the "
        "server runs with --trust-request-chat-template",
    )
    tools: Tools | None = Field(None, description="Functions the model may call")
    tool_choice: ToolChoice | None = Field(
        None, description="none, auto (the default with tools), required, or a named function (forced by a grammar)"
    )
    parallel_tool_calls: bool | None = Field(None, description="false = at most one call")
    functions: Functions | None = Field(None, description="Legacy: tools given as bare functions")
    function_call: FunctionCallChoice | None = Field(None, description="Legacy: none, auto, or {'name'}")
    modalities: Annotated[list[Literal["text"]], Field(max_length=1)] | None = Field(None, description="Only text")
    prediction: Annotated[Any, WithJsonSchema({"type": "null", "description": "Not supported: omit it"})] = None

    def check(self) -> None:
        super().check()
        self.check_nothing_stored("completions")
        if self.prediction is not None:
            raise BadRequest("'prediction' (predicted outputs) is not supported: omit it", "prediction")
        if self.top_logprobs and not self.logprobs:
            raise BadRequest("'top_logprobs' needs 'logprobs' set to true", "top_logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            raise BadRequest("'continue_final_message' needs 'add_generation_prompt' false", "continue_final_message")

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None
