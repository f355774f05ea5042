"""The OpenAPI schema at /schema/openapi.json, with the request bodies described by pydantic itself.

Litestar's generator drops the constraints of values nested in unions and lists (a stop string's
length, a token id's range) and a model's ``json_schema_extra``; pydantic's own JSON schema has
them all, so every bound the server enforces is declared (schemathesis relies on it). Once the
model is loaded, token ids are bounded by its vocabulary too.
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.openapi.plugins import JsonRenderPlugin
from pydantic import BaseModel

from .protocol import (
    TOKEN_ID_KEYS_MARK,
    TOKEN_ID_MARK,
    ChatCompletionRequest,
    CompletionRequest,
)
from .responses_api import ResponsesRequest
from .tokenize_requests import DetokenizeRequest, TokenizeRequest

REQUEST_MODELS: tuple[type[BaseModel], ...] = (
    CompletionRequest,
    ChatCompletionRequest,
    ResponsesRequest,
    TokenizeRequest,
    DetokenizeRequest,
)


class RequestSchemasFromPydantic(JsonRenderPlugin):
    def render(self, request: Request, openapi_schema: dict[str, Any]) -> bytes:
        schemas = openapi_schema.setdefault("components", {}).setdefault("schemas", {})
        for model in REQUEST_MODELS:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            # unknown top-level fields: a 400 unless --allow-extra-fields (protocol.RequestModel)
            schema["additionalProperties"] = request.app.state.settings.allow_extra_fields
            schemas[model.__name__] = schema
        if not request.app.state.settings.trust_request_chat_template:  # then a request's template is a 400
            chat = schemas["ChatCompletionRequest"]["properties"]
            chat["chat_template"] = {"type": "null", "description": "refused: the server uses the model's template"}
            chat["chat_template_kwargs"]["anyOf"][0]["propertyNames"] = {"not": {"const": "chat_template"}}
        limits = request.app.state.client.limits  # None until the model has loaded
        if limits is not None:
            bound_token_ids(schemas, limits.vocab_size)
        return self.render_json(request, openapi_schema)


def bound_token_ids(node: Any, vocab_size: int) -> None:
    """Every marked token id (and logit_bias key) in ``node`` bounded by [0, vocab_size)."""
    if isinstance(node, dict):
        if node.get(TOKEN_ID_MARK):
            node["maximum"] = vocab_size - 1
        if node.get(TOKEN_ID_KEYS_MARK):
            (value,) = node["patternProperties"].values()
            node["patternProperties"] = {f"^({decimal_range(vocab_size - 1)})$": value}
        for child in node.values():
            bound_token_ids(child, vocab_size)
    elif isinstance(node, list):
        for child in node:
            bound_token_ids(child, vocab_size)


def decimal_range(upper: int) -> str:
    """A regex matching exactly the decimals 0..upper, written without leading zeros."""
    digits = str(upper)
    if len(digits) == 1:
        return f"[0-{digits}]"
    shorter = ["[0-9]"] + ([f"[1-9][0-9]{{1,{len(digits) - 2}}}"] if len(digits) > 2 else [])
    same_length = [digits]
    for i, d in enumerate(digits):
        low = 1 if i == 0 else 0
        if int(d) > low:
            rest = len(digits) - i - 1
            lower = str(low) if int(d) - 1 == low else f"[{low}-{int(d) - 1}]"
            same_length.append(digits[:i] + lower + ("[0-9]" if rest == 1 else f"[0-9]{{{rest}}}" if rest else ""))
    return "|".join(shorter + same_length)
