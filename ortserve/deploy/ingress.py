"""The cluster's HTTP front: a Ray Serve ingress deployment that forwards to the engine replicas.

Ray Serve's proxy hands each HTTP request to this Litestar app. The app does not parse or check
the request (the replica's own ortserve server does, so errors are the single server's): it reads
the body, takes its routing key (``prefix_index.routing_key``), and calls the engine deployment's
handle, whose request router picks the replica. The replica's response comes back as a head and
then bytes, relayed as they arrive, so SSE streams stay streams.

A request is sent again (``--attempts`` in all) while nothing of it reached the client: when its
replica died before the first bytes of the body (Ray raises ``RayActorError``; for a stream that
is the first token) or answered ``retry_elsewhere`` (its server unreachable or answering 503).
A request that had started and loses its replica ends: a stream with an error event and
``[DONE]``, as the single server ends streams it cannot finish.

Routes: the OpenAI API and the tokenizer routes (forwarded), ``GET /health`` (200 while at least
one replica reports in), ``GET /cluster`` (the replicas: node, cores, NUMA node, own URL).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from typing import Any

from litestar import Litestar, Request, Response, get, route
from litestar.datastructures import State
from litestar.response import Stream

from ortserve.server.auth import require_api_key
from ortserve.server.errors import EXCEPTION_HANDLERS, EngineUnavailable, error_event
from ortserve.server.settings import DEFAULT_MAX_REQUEST_BODY_BYTES

from .prefix_index import routing_key
from .replica import ForwardedRequest, ResponseHead

logger = logging.getLogger("ortserve.ingress")

POST_ROUTES = ["/v1/chat/completions", "/v1/completions", "/tokenize", "/detokenize"]
GET_ROUTES = ["/v1/models", "/version"]
REPLICA_GONE = EngineUnavailable(
    "the replica serving this request stopped; retry (the others go on serving)", headers={"Retry-After": "1"}
)


@dataclass(frozen=True)
class IngressSettings:
    api_key: str | None = None  # guards /cluster; the replicas check it on the API routes
    public_metrics: bool = False  # read by the shared API-key guard
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    attempts: int = 3


@dataclass
class Routed:
    """A request a replica has started: its head, the first bytes of its body, and the rest."""

    head: ResponseHead
    first: bytes | None
    rest: Any  # Ray Serve's DeploymentResponseGenerator


async def send(engine: Any, request: ForwardedRequest, attempts: int) -> Routed:
    """Route ``request`` to a replica and wait for the first bytes of its body (for a stream, the
    first token; otherwise the whole answer). Until then nothing reached the client, so a replica
    that dies or cannot take it costs only a new attempt, up to ``attempts`` in all."""
    from ray.exceptions import RayActorError

    for attempt in range(1, attempts + 1):
        stream = engine.options(stream=True).remote(request)
        try:
            head = await stream.__anext__()
            if head.retry_elsewhere and attempt < attempts:
                logger.warning("attempt %d of %d: replica %s could not serve it", attempt, attempts, head.replica)
                stream.cancel()
                await asyncio.sleep(0.2 * attempt)
                continue
            first = await anext(stream, None)
        except RayActorError as exc:
            logger.warning("attempt %d of %d: the replica died before answering (%s)", attempt, attempts, exc)
            continue
        except StopAsyncIteration:
            continue
        return Routed(head, first, stream)
    raise EngineUnavailable(
        f"no replica could serve the request after {attempts} attempts; retry", headers={"Retry-After": "1"}
    )


async def relay(routed: Routed, is_sse: bool) -> AsyncIterator[bytes]:
    """The replica's bytes; if the replica is lost mid-way, an SSE stream ends with an error event."""
    from ray.exceptions import RayActorError

    try:
        if routed.first is not None:
            yield routed.first
            async for chunk in routed.rest:
                yield chunk
    except RayActorError:
        logger.warning("a replica stopped while streaming a response")
        if is_sse:
            yield f"data: {error_event(REPLICA_GONE)}\n\ndata: [DONE]\n\n".encode()
    finally:
        routed.rest.cancel()  # the client left, or we are done: the replica stops its request too


def build_ingress_app(engine: Any, directory: Any, settings: IngressSettings) -> Litestar:
    async def forward(request: Request) -> Response[Any]:
        body = await request.body()
        try:
            payload = json.loads(body) if body else None
        except (ValueError, RecursionError):
            payload = None  # the replica answers the 400
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        forwarded = ForwardedRequest(
            request.method, path, body, tuple(request.headers.items()), routing_key(payload) if payload else ""
        )
        routed = await send(engine, forwarded, settings.attempts)
        head = routed.head
        headers = {k: v for k, v in head.headers if k.lower() != "content-type"}
        media_type = dict(head.headers).get("content-type", "application/json")
        headers["x-ortserve-replica"] = head.replica
        return Stream(
            relay(routed, media_type.startswith("text/event-stream")),
            status_code=head.status,
            headers=headers,
            media_type=media_type,
        )

    @route(POST_ROUTES, http_method=["POST"], status_code=200, include_in_schema=False)
    async def forward_post(request: Request) -> Response[Any]:
        return await forward(request)

    @route(GET_ROUTES, http_method=["GET"], status_code=200, include_in_schema=False)
    async def forward_get(request: Request) -> Response[Any]:
        return await forward(request)

    @get("/health", summary="200 while at least one engine replica reports in")
    async def health() -> Response[bytes]:
        if not await directory.replicas.remote():
            raise EngineUnavailable("no engine replica is ready", headers={"Retry-After": "1"})
        return Response(b"", status_code=200)

    @get("/cluster", summary="The engine replicas: node, cores, NUMA node, own URL", guards=[require_api_key])
    async def cluster() -> dict[str, Any]:
        replicas = await directory.replicas.remote()
        return {"replicas": [{k: v for k, v in asdict(r).items() if k != "seen"} for r in replicas]}

    return Litestar(
        route_handlers=[forward_post, forward_get, health, cluster],
        exception_handlers=EXCEPTION_HANDLERS,
        request_max_body_size=settings.max_request_body_bytes,
        state=State({"settings": settings}),
        logging_config=None,
    )


class Ingress:
    """The Ray Serve ingress deployment class (``serve-cluster`` wraps it with ``serve.ingress``
    and ``serve.deployment``); ``engine`` is the engine deployment's handle."""

    def __init__(self, engine: Any, settings: IngressSettings) -> None:
        import ray

        from .replica import DIRECTORY_NAME, DIRECTORY_NAMESPACE

        self.engine = engine
        self.settings = settings
        self.directory = ray.get_actor(DIRECTORY_NAME, namespace=DIRECTORY_NAMESPACE)

    def __serve_build_asgi_app__(self) -> Litestar:
        return build_ingress_app(self.engine, self.directory, self.settings)
