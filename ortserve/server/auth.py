"""The API key (``--api-key``): a Litestar guard on every route but /health, as vLLM and OpenAI
do it (``Authorization: Bearer KEY``); /metrics is open only with --public-metrics."""

from __future__ import annotations

import hmac

from litestar.connection import ASGIConnection
from litestar.handlers.base import BaseRouteHandler

from .errors import Unauthorized


async def require_api_key(connection: ASGIConnection, _: BaseRouteHandler) -> None:
    expected: str | None = connection.app.state.settings.api_key
    if not expected:
        return
    header = connection.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise Unauthorized("Missing API key: send 'Authorization: Bearer <key>'", "authorization")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), expected.encode()):
        raise Unauthorized("Incorrect API key provided", "authorization")


async def require_api_key_unless_public_metrics(connection: ASGIConnection, handler: BaseRouteHandler) -> None:
    if not connection.app.state.settings.public_metrics:
        await require_api_key(connection, handler)
