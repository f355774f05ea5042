"""The engine core in its own process: load the model, report readiness, then loop.

The loop drains incoming messages, steps while there is work, and blocks on the pipe when
idle (no busy wait). After every step it sends the new tokens and the stats. The process
ignores SIGINT/SIGTERM: the HTTP process owns shutdown and says so with ``Shutdown``, and a
closed pipe (the HTTP process died) ends the loop too.
"""
from __future__ import annotations

import logging
import multiprocessing as mp
import signal
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from .ipc import (
    AbortRequests,
    AddRequest,
    EngineFailed,
    EngineInfo,
    EngineReady,
    Shutdown,
    StepResult,
)

logger = logging.getLogger("ortserve.engine_process")

# Builds the core in the engine process: config -> (core, info). Must be picklable (spawn).
CoreFactory = Callable[[Any], "tuple[Any, EngineInfo]"]


def build_engine_core(config: Any) -> tuple[Any, EngineInfo]:
    """The real engine; it resolves MODEL itself (exporting a built-in on first run)."""
    from ortserve.engine.core import EngineCore

    core = EngineCore(config)
    return core, EngineInfo(
        artifact_dir=str(core.tokenizer_dir),
        max_model_len=core.max_model_len,
        vocab_size=core.vocab_size,
        max_num_seqs=core.config.max_num_seqs,
        num_blocks=core.num_blocks,
        block_size=core.config.block_size,
        eos_token_ids=sorted(core.eos_token_ids),
        engine_cores=list(core.threads.cores) if core.threads.bind else [],
    )


def run_engine_process(config: Any, inbox: Connection, outbox: Connection,
                       factory: CoreFactory) -> None:
    """The engine process's main function."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s engine: %(message)s")
    try:
        core, info = factory(config)
    except BaseException as exc:  # noqa: BLE001 - every start-up failure must reach the user
        _send_quietly(outbox, EngineFailed(_describe_failure(exc), during_startup=True))
        sys.exit(1)
    outbox.send(EngineReady(info))
    try:
        EngineLoop(core, inbox, outbox).run()
    except BaseException as exc:  # noqa: BLE001
        logger.error("engine step failed:\n%s", traceback.format_exc())
        _send_quietly(outbox, EngineFailed(_describe_failure(exc), during_startup=False))
        sys.exit(1)


def _describe_failure(exc: BaseException) -> str:
    if isinstance(exc, (ValueError, RuntimeError, OSError, ImportError)):
        return str(exc) or type(exc).__name__  # our own errors say what to change
    return f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"


def _send_quietly(outbox: Connection, message: Any) -> None:
    try:
        outbox.send(message)
    except OSError:
        pass  # the server is gone; nobody to tell


class EngineLoop:
    def __init__(self, core: Any, inbox: Connection, outbox: Connection) -> None:
        self.core = core
        self.inbox = inbox
        self.outbox = outbox

    def run(self) -> None:
        while True:
            busy = self.core.has_unfinished_requests()
            messages = self._receive(block=not busy)
            rejected: dict[str, str] = {}
            changed = False
            for message in messages:
                if isinstance(message, Shutdown):
                    return
                if isinstance(message, AddRequest):
                    try:
                        self.core.add_request(message.request)
                    except ValueError as exc:  # RequestRejected names the limit
                        rejected[message.request.request_id] = str(exc)
                elif isinstance(message, AbortRequests):
                    self.core.abort_requests(message.request_ids)
                    changed = True
            if self.core.has_unfinished_requests():
                outputs = self.core.step()
                self.outbox.send(StepResult(outputs, self.core.stats(), rejected))
            elif rejected or changed:  # no step, but the server must hear about it
                self.outbox.send(StepResult([], self.core.stats(), rejected))

    def _receive(self, block: bool) -> list[Any]:
        """Every message waiting in the pipe; wait for the first one when idle.
        A closed pipe reads as Shutdown."""
        messages: list[Any] = []
        try:
            if block:
                messages.append(self.inbox.recv())
            while self.inbox.poll():
                messages.append(self.inbox.recv())
        except (EOFError, OSError):
            messages.append(Shutdown())
        return messages


class EngineProcess:
    """The HTTP side's handle on the engine process: start it, send to it, receive from it."""

    def __init__(self, config: Any, factory: CoreFactory = build_engine_core) -> None:
        ctx = mp.get_context("spawn")
        inbox_reader, self._inbox = ctx.Pipe(duplex=False)
        self._outbox, outbox_writer = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=run_engine_process, name="ortserve-engine",
                                   args=(config, inbox_reader, outbox_writer, factory),
                                   daemon=False)  # it may start processes of its own
        self.process.start()
        # Close our copies of the child's ends, so either side sees EOF when the other dies.
        inbox_reader.close()
        outbox_writer.close()

    def send(self, message: Any) -> None:
        self._inbox.send(message)

    def recv(self) -> Any:
        """Blocks; raises EOFError when the engine process is gone."""
        return self._outbox.recv()

    def close(self, timeout: float = 10.0) -> int | None:
        """Ask the engine to stop, wait for it, and return its exit code. Call once nothing
        else sends (a Connection is not safe for two writers)."""
        try:
            self._inbox.send(Shutdown())
        except OSError:
            pass
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
        self._inbox.close()
        return self.process.exitcode
