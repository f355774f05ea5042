"""``ortserve serve [MODEL]``: the OpenAI-compatible server.

Binds first, so /health answers 503 while the engine process loads (and, on first run, exports
the embedded model); a start-up failure is printed and exits non-zero. Accepted sockets have
TCP_NODELAY (inherited from the listening socket). SIGTERM drains: stop accepting, let in-flight
requests finish within --drain-timeout, then end the streams still open with an error event and
[DONE], and exit 0.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

HELP = "serve a model over an OpenAI-compatible HTTP API"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ortserve.engine.config import add_engine_arguments

    from .settings import DEFAULT_MAX_QUEUED_TOKENS, DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_MAX_WAITING_REQUESTS

    parser.add_argument(
        "model_arg",
        nargs="?",
        metavar="MODEL",
        default=None,
        help="artifact directory, Hugging Face checkpoint directory, .gguf file or built-in model name "
        "(default: the embedded SmolLM2-135M-Instruct); anything but an artifact is exported on first "
        "run and cached by content",
    )
    http = parser.add_argument_group("http")
    http.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    http.add_argument(
        "--port", type=number_in(0, 65535), default=8000, help="port to listen on (default 8000; 0 = any free)"
    )
    http.add_argument(
        "--api-key",
        default=None,
        help="require 'Authorization: Bearer KEY' on /v1 and tokenizer routes (env ORTSERVE_API_KEY)",
    )
    http.add_argument(
        "--served-model-name", default=None, help="the name clients put in 'model' (default: MODEL as given)"
    )
    http.add_argument(
        "--max-waiting-requests",
        type=number_in(0),
        default=DEFAULT_MAX_WAITING_REQUESTS,
        help="answer 429 when more sequences than this would wait for the engine "
        f"(default {DEFAULT_MAX_WAITING_REQUESTS})",
    )
    http.add_argument(
        "--max-queued-tokens",
        type=number_in(1),
        default=DEFAULT_MAX_QUEUED_TOKENS,
        help="answer 429 when the prompt tokens of requests not yet started would pass this "
        f"(default {DEFAULT_MAX_QUEUED_TOKENS})",
    )
    http.add_argument(
        "--engine-timeout",
        type=number_in(0.1, kind=float),
        default=60.0,
        help="seconds without engine progress, with requests pending, before /health is 503 (default 60)",
    )
    http.add_argument(
        "--max-engine-restarts",
        type=number_in(0),
        default=5,
        help="restarts of a dead engine allowed within 5 minutes before the server stops (default 5)",
    )
    http.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="accept a chat template in the request (rendered in a sandboxed worker)",
    )
    http.add_argument(
        "--allow-special-tokens-in-content",
        action="store_true",
        help="let chat message content contain special-token strings (can forge turns)",
    )
    http.add_argument("--public-metrics", action="store_true", help="serve /metrics without the API key")
    http.add_argument(
        "--allow-extra-fields",
        action="store_true",
        help="ignore unknown top-level request fields (default: a 400 naming them)",
    )
    http.add_argument(
        "--tool-call-parser",
        default="auto",
        choices=["auto", "hermes", "llama3_json", "mistral"],
        help="how tool calls are written in the model's output (default auto: from the chat template)",
    )
    http.add_argument(
        "--max-request-body-bytes",
        type=number_in(1024),
        default=DEFAULT_MAX_REQUEST_BODY_BYTES,
        help=f"answer 413 above this body size (default {DEFAULT_MAX_REQUEST_BODY_BYTES})",
    )
    http.add_argument(
        "--drain-timeout",
        type=number_in(0, kind=float),
        default=30.0,
        help="on SIGTERM, seconds to let in-flight requests finish (default 30)",
    )
    http.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_engine_arguments(parser)


def run(args: argparse.Namespace, factory=None) -> int:
    import os

    from ortserve.tokenizer import block_torch_import

    block_torch_import()  # before transformers: this process only needs the tokenizer
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    from ortserve.engine.config import EngineConfig
    from ortserve.models import DEFAULT_MODEL

    from .engine_client import Supervision
    from .settings import ServerSettings

    if args.model_arg is not None:
        if args.model not in (None, args.model_arg):
            print(f"error: MODEL {args.model_arg!r} and --model {args.model!r} disagree; give one", file=sys.stderr)
            return 2
        args.model = args.model_arg
    try:
        config = EngineConfig.from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings = ServerSettings(
        served_model_name=args.served_model_name or args.model or DEFAULT_MODEL,
        api_key=args.api_key or os.environ.get("ORTSERVE_API_KEY") or None,
        max_waiting_requests=args.max_waiting_requests,
        max_request_body_bytes=args.max_request_body_bytes,
        drain_timeout=args.drain_timeout,
        trust_request_chat_template=args.trust_request_chat_template,
        public_metrics=args.public_metrics,
        allow_extra_fields=args.allow_extra_fields,
        tool_call_parser=args.tool_call_parser,
    )
    supervision = Supervision(
        max_waiting_requests=args.max_waiting_requests,
        max_queued_tokens=args.max_queued_tokens,
        engine_timeout=args.engine_timeout,
        max_restarts=args.max_engine_restarts,
        allow_special_tokens_in_content=args.allow_special_tokens_in_content,
    )
    return asyncio.run(serve(config, settings, supervision, args.host, args.port, args.log_level, factory))


async def serve(
    config,
    settings,
    supervision,
    host: str,
    port: int,
    log_level: str = "info",
    factory=None,
) -> int:
    """Run the server until SIGTERM/SIGINT or an engine failure; the process exit code."""
    import uvicorn

    from .app import create_app
    from .engine_client import EngineClient
    from .engine_process import build_llm_engine
    from .errors import EngineUnavailable

    client = EngineClient(config, supervision, factory=factory or build_llm_engine)
    app = create_app(client, settings)
    # uvicorn cuts what is left at timeout_graceful_shutdown; we end the streams a moment before.
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            timeout_graceful_shutdown=settings.drain_timeout + 2,
            lifespan="on",
            access_log=log_level == "debug",
        )
    )
    failures: list[str] = []

    def on_failure(message: str) -> None:
        failures.append(message)
        server.should_exit = True

    client.on_failure.append(on_failure)
    client_ready = asyncio.ensure_future(_announce_ready(client, settings))

    async def drain() -> None:
        while not server.should_exit:
            await asyncio.sleep(0.1)
        await asyncio.sleep(settings.drain_timeout)
        if client.num_in_flight:
            logging.getLogger("ortserve.server").warning(
                "--drain-timeout %g s passed: ending %d requests", settings.drain_timeout, client.num_in_flight
            )
            client.fail_all(EngineUnavailable("the server is shutting down (--drain-timeout passed)"))

    try:
        sock = listening_socket(host, port, server.config.backlog)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        hint = " (another server on this port? pick one with --port)" if exc.errno == errno.EADDRINUSE else ""
        print(f"ortserve: error: cannot listen on {host}:{port}: {reason}{hint}", file=sys.stderr, flush=True)
        client_ready.cancel()
        return 1
    drainer = asyncio.ensure_future(drain())
    bound_host, bound_port = sock.getsockname()[:2]
    print(
        f"ortserve: listening on http://{bound_host}:{bound_port} "
        f"(model {settings.served_model_name!r} loading; GET /health is 503 until ready; "
        f"OpenAPI at /schema)",
        flush=True,
    )
    # uvicorn re-raises a handled SIGTERM after shutdown; with this no-op it stays a clean exit 0.
    signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        await server.serve(sockets=[sock])
    finally:
        client_ready.cancel()
        drainer.cancel()
    if failures:
        print(f"ortserve: error: {failures[0]}", file=sys.stderr, flush=True)
        return 1
    return 0


def number_in(least: float, most: float | None = None, kind: type = int) -> Callable[[str], Any]:
    """An argparse type: a ``kind`` number in [least, most]; argparse names the flag when it is not."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if value < least or (most is not None and value > most):
            span = f"from {least} to {most}" if most is not None else f"at least {least}"
            raise argparse.ArgumentTypeError(f"{text} is out of range: give a value {span}")
        return value

    return parse


def listening_socket(host: str, port: int, backlog: int) -> socket.socket:
    """The bound, listening socket: connections queue from now on, before uvicorn accepts, and
    accepted sockets inherit TCP_NODELAY (no ~40 ms delayed-ACK stall per keep-alive request).
    OSError (address in use, unknown host) for the caller to report."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


async def _announce_ready(client, settings) -> None:
    await client.ready.wait()
    info = client.info
    http_cores = keep_off_engine_cores(info.engine_cores)
    print(
        f"ortserve: ready: {settings.served_model_name!r} from {info.artifact_dir} "
        f"(max_model_len {info.max_model_len}; HTTP on cores {http_cores or 'shared with the engine'})",
        flush=True,
    )


def keep_off_engine_cores(engine_cores: list[int]) -> list[int]:
    """Move this process's threads off the engine's pinned cores onto the rest (--reserved-cpus),
    if any are left; returns the cores it now runs on ([] = none left, unchanged)."""
    import os

    from ortserve.engine.threads import cores_left

    free = cores_left(engine_cores)
    if not engine_cores or not free:
        return []
    for task in os.listdir("/proc/self/task"):  # every thread; new ones inherit the creator's
        try:
            os.sched_setaffinity(int(task), free)
        except OSError:
            pass  # the thread ended meanwhile
    return free
