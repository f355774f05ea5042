"""Request bodies of /tokenize and /detokenize (vLLM's), beside the generation requests of
``protocol``: the same prompt and message types, so a prompt tokenizes as it would be served."""

from __future__ import annotations

from typing import Annotated

from pydantic import ConfigDict, Field

from .errors import BadRequest
from .protocol import MAX_MESSAGES, MAX_PROMPT_TOKENS, ChatMessage, PromptText, RequestModel, TokenId
from .schema_rules import requires


class TokenizeRequest(RequestModel):
    """POST /tokenize: either a prompt or chat messages (exactly one: the schema's oneOf)."""

    model_config = ConfigDict(
        extra="allow",
        strict=True,
        json_schema_extra={
            "allOf": [requires("continue_final_message", {"const": True}, "add_generation_prompt", False)],
            "oneOf": [
                {"required": ["prompt"], "properties": {"prompt": {"type": "string"}, "messages": {"type": "null"}}},
                {
                    "required": ["messages"],
                    "properties": {"messages": {"type": "array", "minItems": 1}, "prompt": {"type": "null"}},
                },
            ],
        },
    )

    model: str | None = None
    prompt: PromptText | None = None
    messages: Annotated[list[ChatMessage], Field(max_length=MAX_MESSAGES)] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = Field(True, description="Only for 'prompt'; chat templates add their own")

    def check(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise BadRequest("give exactly one of 'prompt' and 'messages'", "prompt")
        if self.messages is not None and not self.messages:
            raise BadRequest("'messages' must not be empty", "messages")
        if self.continue_final_message and self.add_generation_prompt:
            raise BadRequest("'continue_final_message' needs 'add_generation_prompt' false", "continue_final_message")


class DetokenizeRequest(RequestModel):
    model: str | None = None
    tokens: Annotated[list[TokenId], Field(max_length=MAX_PROMPT_TOKENS)]
