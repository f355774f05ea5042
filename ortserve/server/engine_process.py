"""The engine in its own process: load the model, report readiness, then loop.

The loop drains incoming messages, steps the ``LLMEngine`` while there is work, and blocks on the
pipe when idle (no busy wait). After a step with news (deltas due, errors, aborts) it sends them
with the stats that changed; steps without news (tokens held by ``--stream-interval`` or for
non-streaming requests) send only their stats, at most every ``STATS_PERIOD`` seconds. Messages
are ``engine.ipc`` structs, msgpack-encoded. The process ignores SIGINT and SIGTERM: the HTTP
process owns shutdown and says so with ``Shutdown``; a closed pipe (the HTTP process died) ends the
loop too. A request that cannot be served gets a ``RequestError``; an exception in the loop itself
is reported as ``EngineFailed`` and the process exits (the HTTP process restarts it).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING

import msgspec

from ortserve.engine.config import EngineConfig
from ortserve.engine.ipc import (
    AbortRequests,
    AddRequest,
    EngineFailed,
    EngineReady,
    ErrorCode,
    Message,
    RequestError,
    Shutdown,
    StepResult,
    api_side,
    engine_side,
)

if TYPE_CHECKING:
    from ortserve.engine.llm_engine import LLMEngine

logger = logging.getLogger("ortserve.engine_process")

# Builds the engine in the engine process from the config. Must be picklable (spawn).
EngineFactory = Callable[[EngineConfig], "LLMEngine"]


def build_llm_engine(config: EngineConfig) -> LLMEngine:
    """The real engine; it resolves MODEL itself (exporting a built-in on first run)."""
    from ortserve.engine.llm_engine import LLMEngine

    return LLMEngine.from_config(config, served=True)


def run_engine_process(config: EngineConfig, inbox: Connection, outbox: Connection, factory: EngineFactory) -> None:
    """The engine process's main function."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s engine: %(message)s")
    channel = engine_side()
    try:
        engine = factory(config)
    except BaseException as exc:
        stated = isinstance(exc, (ValueError, RuntimeError, OSError, ImportError))  # errors that say what is wrong
        if stated:  # a bad flag, model or file: its sentence is the report (the traceback at debug level)
            logger.error("engine start-up failed: %s", exc)
            logger.debug("engine start-up failure", exc_info=exc)
        else:
            logger.exception("engine start-up failed")
        message = str(exc) if stated else "see the log"
        _send_quietly(outbox, channel.encode(EngineFailed(ErrorCode.STARTUP, message or type(exc).__name__)))
        sys.exit(1)
    outbox.send_bytes(channel.encode(EngineReady(engine.info())))
    try:
        EngineLoop(engine, inbox, outbox).run()
    except BaseException:
        logger.exception("the engine loop failed")
        _send_quietly(outbox, channel.encode(EngineFailed(ErrorCode.CRASHED, "the engine loop failed")))
        sys.exit(1)


def _send_quietly(outbox: Connection, data: bytes) -> None:
    try:
        outbox.send_bytes(data)
    except OSError:
        pass  # the server is gone; nobody to tell


STATS_PERIOD = 0.1  # seconds: the longest the server's gauges wait while steps have no news


class EngineLoop:
    def __init__(self, engine: LLMEngine, inbox: Connection, outbox: Connection) -> None:
        self.engine = engine
        self.inbox = inbox
        self.outbox = outbox
        self.channel = engine_side()
        self.last_sent = 0.0  # time.monotonic() of the last StepResult

    def run(self) -> None:
        while True:
            errors: list[RequestError] = []
            changed = False
            for message in self._receive(block=not self.engine.has_unfinished_requests(), errors=errors):
                if isinstance(message, Shutdown):
                    return
                if isinstance(message, AddRequest):
                    request = message.request
                    try:
                        self.engine.add_request(request.request_id, request.prompt_token_ids, request.sampling_params)
                    except ValueError as exc:  # InvalidParameter names the limit
                        errors.append(RequestError(request.request_id, ErrorCode.INVALID_REQUEST, str(exc)))
                elif isinstance(message, AbortRequests):
                    self.engine.abort_requests(message.request_ids)
                    changed = True
            deltas = self.engine.step() if self.engine.has_unfinished_requests() else []
            if deltas or errors or changed or time.monotonic() - self.last_sent >= STATS_PERIOD:
                self._send(StepResult(deltas, self.engine.stats(), errors))

    def _send(self, message: StepResult) -> None:
        self.outbox.send_bytes(self.channel.encode(message))
        self.last_sent = time.monotonic()

    def _receive(self, block: bool, errors: list[RequestError]) -> list[Message]:
        """Every message waiting in the pipe; wait for the first one when idle. A closed pipe
        reads as Shutdown; a message that does not decode fails its request, not the loop."""
        messages: list[Message] = []
        try:
            while block or self.inbox.poll():
                block = False
                data = self.inbox.recv_bytes()
                try:
                    messages.append(self.channel.decode(data))
                except msgspec.ValidationError as exc:
                    logger.error("a message from the server does not decode: %s", exc)
                    request_id = _request_id_of(data)
                    if request_id is not None:
                        errors.append(RequestError(request_id, ErrorCode.INTERNAL, "the request did not decode"))
        except (EOFError, OSError):
            messages.append(Shutdown())
        return messages


def _request_id_of(data: bytes) -> str | None:
    try:
        message = msgspec.msgpack.decode(data)
        return str(message["request"]["request_id"])
    except (msgspec.DecodeError, KeyError, TypeError):
        return None


class EngineProcess:
    """The HTTP side's handle on one engine process: start it, send to it, receive from it."""

    def __init__(self, config: EngineConfig, factory: EngineFactory = build_llm_engine) -> None:
        ctx = mp.get_context("spawn")
        inbox_reader, self._inbox = ctx.Pipe(duplex=False)
        self._outbox, outbox_writer = ctx.Pipe(duplex=False)
        self.channel = api_side()
        self.process = ctx.Process(
            target=run_engine_process,
            name="ortserve-engine",
            args=(config, inbox_reader, outbox_writer, factory),
            daemon=False,
        )  # it may start processes of its own
        self.process.start()
        # Close our copies of the child's ends, so either side sees EOF when the other dies.
        inbox_reader.close()
        outbox_writer.close()

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, message: Message) -> None:
        self._inbox.send_bytes(self.channel.encode(message))

    def recv(self) -> Message:
        """Blocks; raises EOFError when the engine process is gone."""
        return self.channel.decode(self._outbox.recv_bytes())

    def close(self, timeout: float = 10.0) -> int | None:
        """Ask the engine to stop, wait for it, and return its exit code. Call once nothing
        else sends (a Connection is not safe for two writers)."""
        try:
            self._inbox.send_bytes(self.channel.encode(Shutdown()))
        except OSError:
            pass
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(5)
        self._inbox.close()
        return self.process.exitcode
