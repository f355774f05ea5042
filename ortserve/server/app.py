"""The Litestar app: controllers, dependencies (the engine client and the services), error
handlers, metrics, and the engine's life cycle tied to the app's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from litestar import Litestar, Router
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.plugins.pydantic import PydanticPlugin

from ortserve import __version__

from .auth import require_api_key
from .chat import ChatService
from .completions import CompletionsService
from .controllers import OpenAIController, OpsController, TokenizerController
from .engine_client import EngineClient
from .errors import EXCEPTION_HANDLERS
from .metrics import ServerMetrics
from .openapi import RequestSchemasFromPydantic
from .responses_api import ResponsesService
from .settings import ServerSettings
from .template_sandbox import TemplateSandbox


def create_app(client: EngineClient, settings: ServerSettings) -> Litestar:
    """The app around an engine client; the client is started with the app and stopped after it."""
    metrics = ServerMetrics(settings.served_model_name)
    client.observers.append(metrics)
    sandbox = TemplateSandbox()
    chat = ChatService(client, settings, sandbox)
    singletons = {
        "client": client,
        "settings": settings,
        "metrics": metrics,
        "completions": CompletionsService(client, settings.served_model_name),
        "chat": chat,
        "responses": ResponsesService(chat),
    }

    @asynccontextmanager
    async def engine_lifespan(_: Litestar) -> AsyncIterator[None]:
        await client.start()
        try:
            yield
        finally:
            sandbox.close()
            await client.shutdown()

    return Litestar(
        route_handlers=[OpenAIController, TokenizerController, OpsController],
        dependencies={
            name: Provide(_constant(value), use_cache=True, sync_to_thread=False) for name, value in singletons.items()
        },
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_request_body_bytes,
        plugins=[PydanticPlugin(validate_strict=True)],  # types as the schema states them: true is not 1
        lifespan=[engine_lifespan],
        state=State({"settings": settings, "client": client}),  # the API-key guard, the OpenAPI schema
        openapi_config=OpenAPIConfig(
            title="ortserve",
            version=__version__,
            description="OpenAI-compatible LLM serving on CPU",
            openapi_router=Router("/schema", route_handlers=[], guards=[require_api_key]),
            render_plugins=[RequestSchemasFromPydantic()],
        ),
        logging_config=None,
    )


def _constant(value: object):
    def provide() -> object:
        return value

    provide.__annotations__["return"] = type(value)
    return provide
