"""The HTTP routes, as Litestar controllers: declarations only; the work is in the services."""

from __future__ import annotations

import asyncio
from typing import Protocol, TypeVar

from litestar import Controller, Request, Response, get, post
from litestar.openapi import ResponseSpec

from ortserve import __version__

from .auth import require_api_key, require_api_key_unless_public_metrics
from .chat import ChatService
from .completions import CompletionsService
from .engine_client import EngineClient
from .errors import EngineUnavailable, ModelNotFound
from .metrics import CONTENT_TYPE_LATEST, ServerMetrics
from .protocol import (
    ChatCompletionRequest,
    CompletionRequest,
)
from .response_items import ResponseObject
from .responses import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionResponse,
    DetokenizeResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
    TokenizeResponse,
)
from .responses_api import ResponsesRequest, ResponsesService
from .sampling import as_bad_request
from .settings import ServerSettings
from .streams import EventStream
from .tokenize_requests import DetokenizeRequest, TokenizeRequest

T = TypeVar("T")


class CheckedRequest(Protocol):
    """A request body that names a model and refuses the fields it does not know (RequestModel)."""

    model: str | None

    def check_fields(self, allow_extra: bool) -> None: ...


CLIENT_GONE = 499  # nginx's "client closed request": nobody reads this response

ERROR_STATUSES = {
    400: "Invalid request; the message names the field",
    401: "Missing or wrong API key (when the server has --api-key)",
    404: "Unknown model",
    413: "Body larger than --max-request-body-bytes",
    429: "Over --max-waiting-requests or --max-queued-tokens; retry after Retry-After seconds",
    500: "Internal error; the message gives an id that the server log has the details for",
    503: "Model loading, or the engine restarting after a failure; retry after Retry-After seconds",
}
ERRORS = {
    status: ResponseSpec(ErrorResponse, description=text, generate_examples=False)
    for status, text in ERROR_STATUSES.items()
}


def generation_responses(body: type, chunk: type) -> dict[int, ResponseSpec]:
    """The 200 of a generation route: JSON, or with stream=true an SSE stream of chunks."""
    return {
        200: ResponseSpec(
            body,
            generate_examples=False,
            description=f"{body.__name__}; with stream=true, text/event-stream "
            f"events of {chunk.__name__} ending with 'data: [DONE]'",
        ),
        **ERRORS,
    }


def check_request(settings: ServerSettings, data: CheckedRequest) -> None:
    """What every request body's route checks first: the model it names, then its unknown fields."""
    check_model(settings, data.model)
    data.check_fields(settings.allow_extra_fields)


def or_client_gone(result: T | None) -> T | Response[bytes]:
    """A generation's result, or an empty 499 when the client left before it was ready (None)."""
    return result if result is not None else Response(b"", status_code=CLIENT_GONE)


def check_model(settings: ServerSettings, model: str | None) -> None:
    if model is not None and model not in settings.model_names():
        raise ModelNotFound(
            f"The model '{model}' does not exist; this server serves '{settings.served_model_name}' (GET /v1/models)",
            "model",
        )


class OpenAIController(Controller):
    """The OpenAI API: completions, chat completions, responses, models."""

    path = "/v1"
    guards = [require_api_key]
    tags = ["OpenAI"]

    @post(
        "/completions",
        status_code=200,
        summary="Create a completion",
        responses=generation_responses(CompletionResponse, CompletionResponse),
    )
    async def create_completion(
        self, data: CompletionRequest, request: Request, completions: CompletionsService, settings: ServerSettings
    ) -> CompletionResponse | EventStream | Response[bytes]:
        check_request(settings, data)
        return or_client_gone(await completions.create(data, request))

    @post(
        "/chat/completions",
        status_code=200,
        summary="Create a chat completion",
        responses=generation_responses(ChatCompletionResponse, ChatCompletionChunk),
    )
    async def create_chat_completion(
        self, data: ChatCompletionRequest, request: Request, chat: ChatService, settings: ServerSettings
    ) -> ChatCompletionResponse | EventStream | Response[bytes]:
        check_request(settings, data)
        return or_client_gone(await chat.create(data, request))

    @post(
        "/responses",
        status_code=200,
        summary="Create a response (the Responses API, stateless)",
        responses=generation_responses(ResponseObject, ResponseObject),
    )
    async def create_response(
        self, data: ResponsesRequest, request: Request, responses: ResponsesService, settings: ServerSettings
    ) -> ResponseObject | EventStream | Response[bytes]:
        check_request(settings, data)
        return or_client_gone(await responses.create(data, request))

    @get("/models", summary="List the served models", responses=ERRORS)
    async def list_models(self, client: EngineClient, settings: ServerSettings) -> ModelList:
        return ModelList(data=[model_card(client, settings)])

    @get("/models/{model_id:str}", summary="One served model (404 for any other name)", responses=ERRORS)
    async def retrieve_model(self, model_id: str, client: EngineClient, settings: ServerSettings) -> ModelCard:
        check_model(settings, model_id)
        return model_card(client, settings)


def model_card(client: EngineClient, settings: ServerSettings) -> ModelCard:
    info = client.info
    return ModelCard(
        id=settings.served_model_name,
        created=settings.started_at,
        root=info.artifact_dir if info else None,
        max_model_len=info.max_model_len if info else None,
    )


class TokenizerController(Controller):
    """vLLM's /tokenize and /detokenize."""

    tags = ["Tokenizer"]
    guards = [require_api_key]

    @post("/tokenize", status_code=200, summary="Token ids of a prompt or of chat messages", responses=ERRORS)
    async def tokenize(self, data: TokenizeRequest, client: EngineClient, settings: ServerSettings) -> TokenizeResponse:
        check_request(settings, data)
        data.check()
        prompts, limits = client.check_ready()
        with as_bad_request(TokenizeRequest.model_fields):
            if data.messages is not None:
                tokens = await asyncio.to_thread(
                    prompts.chat_token_ids,
                    [m.conversation_entry() for m in data.messages],
                    data.add_generation_prompt,
                    data.continue_final_message,
                )
            else:
                tokens = await asyncio.to_thread(prompts.encode, data.prompt or "", data.add_special_tokens)
        return TokenizeResponse(count=len(tokens), max_model_len=limits.max_model_len, tokens=tokens)

    @post("/detokenize", status_code=200, summary="Text of token ids", responses=ERRORS)
    async def detokenize(
        self, data: DetokenizeRequest, client: EngineClient, settings: ServerSettings
    ) -> DetokenizeResponse:
        check_request(settings, data)
        prompts, limits = client.check_ready()
        with as_bad_request(DetokenizeRequest.model_fields):
            limits.check_token_ids(data.tokens, "tokens")
        return DetokenizeResponse(prompt=await asyncio.to_thread(prompts.decode, data.tokens))


HEALTH = {
    "loading": "the model is still loading",
    "stalled": "the engine made no progress for --engine-timeout seconds with requests pending",
    "restarting": "the engine is restarting after a failure",
    "failed": "the engine is not running",
    "stopped": "the server is shutting down",
}


class OpsController(Controller):
    """Health (always open), version, and Prometheus metrics (behind --api-key unless --public-metrics)."""

    tags = ["Operations"]

    @get("/health", summary="200 while the engine serves; 503 while loading, stalled, restarting or down")
    async def health(self, client: EngineClient) -> Response[bytes]:
        if client.state != "ready":
            raise EngineUnavailable(HEALTH[client.state], headers={"Retry-After": "1"})
        return Response(b"", status_code=200)

    @get("/version", summary="The ortserve version", guards=[require_api_key])
    async def version(self) -> dict[str, str]:
        return {"version": __version__}

    @get(
        "/metrics",
        summary="Prometheus metrics",
        media_type=CONTENT_TYPE_LATEST,
        guards=[require_api_key_unless_public_metrics],
    )
    async def metrics(self, metrics: ServerMetrics) -> Response[bytes]:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)
