"""The OpenAPI schema at /schema/openapi.json, with the request bodies described by pydantic itself.

Litestar's generator drops the constraints of values nested in unions and lists (a stop string's
length, a token id's range) and a model's ``json_schema_extra``; pydantic's own JSON schema has
them all, so every bound the server enforces is declared (schemathesis relies on it).
"""

from __future__ import annotations

from typing import Any

from litestar import Request
from litestar.openapi.plugins import JsonRenderPlugin
from pydantic import BaseModel

from .protocol import ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from .responses_api import ResponsesRequest

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
        return self.render_json(request, openapi_schema)
