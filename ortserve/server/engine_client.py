"""The HTTP process's async handle on the engine process.

One reader thread turns the engine's messages into event-loop callbacks; one writer thread
sends ours (a send must never block the event loop while the engine is mid-step). Each request
has an ``asyncio.Queue`` of ``RequestOutput``s made by the ``OutputProcessor`` (detokenisation
and stop strings run here, not in the engine). A request whose consumer goes away (the HTTP
client disconnected, or the server is draining) is aborted in the engine, which drops it
before its next step.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from .engine_process import CoreFactory, EngineProcess, build_engine_core
from .errors import BadRequest, EngineFailure, EngineUnavailable, Overloaded
from .ipc import (
    AbortRequests,
    AddRequest,
    EngineFailed,
    EngineInfo,
    EngineReady,
    StepResult,
)
from .prompts import Prompts, load_tokenizer

logger = logging.getLogger("ortserve.server")


class EngineObserver(Protocol):
    def observe_stats(self, stats: Any) -> None: ...
    def observe_finished(self, reason: str | None) -> None: ...


class EngineClient:
    def __init__(self, config: Any, *, max_waiting_requests: int,
                 factory: CoreFactory = build_engine_core,
                 tokenizer_loader: Callable[[str], Any] = load_tokenizer,
                 output_processor: Callable[[Any], Any] | None = None) -> None:
        self.config = config
        self.max_waiting_requests = max_waiting_requests
        self.factory = factory
        self.tokenizer_loader = tokenizer_loader
        self.output_processor = output_processor
        self.state = "loading"  # -> ready | failed | stopped
        self.failure: str | None = None
        self.info: EngineInfo | None = None
        self.prompts: Prompts | None = None
        self.ready = asyncio.Event()
        self.observers: list[EngineObserver] = []
        self.on_failure: list[Callable[[str], None]] = []
        self.stats: Any = None
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._num_seqs: dict[str, int] = {}
        self._processor: Any = None
        self._process: EngineProcess | None = None
        self._outgoing: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._threads: list[threading.Thread] = []

    # --- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engine process; returns at once, ``ready`` is set when the model is loaded."""
        self._loop = asyncio.get_running_loop()
        self._process = await asyncio.to_thread(EngineProcess, self.config, self.factory)
        for target, name in ((self._read_loop, "engine-reader"), (self._write_loop, "engine-writer")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    async def shutdown(self, timeout: float = 10.0) -> None:
        if self.state == "stopped":
            return
        self.state = "stopped"
        self._fail_all(EngineUnavailable("the server is shutting down"))
        self._outgoing.put(None)  # the writer sends what is queued, then stops
        if self._process is not None:
            for thread in self._threads[1:]:  # the writer: one thread per pipe end
                await asyncio.to_thread(thread.join, timeout)
            code = await asyncio.to_thread(self._process.close, timeout)
            logger.info("engine process exited with code %s", code)

    # --- requests ----------------------------------------------------------------------------

    def check_ready(self) -> Prompts:
        if self.state == "ready" and self.prompts is not None:
            return self.prompts
        if self.state == "loading":
            raise EngineUnavailable("the model is still loading; retry shortly (GET /health)")
        raise EngineUnavailable(f"the engine is not running: {self.failure or self.state}")

    def check_capacity(self, num_seqs: int = 1) -> None:
        """Backpressure: refuse when admitting ``num_seqs`` more would leave more than
        --max-waiting-requests waiting. Waiting = what the engine last reported (it also counts
        preempted requests), or the in-flight sequences beyond --max-num-seqs, if more."""
        assert self.info is not None
        in_flight = sum(self._num_seqs.values())
        reported = self.stats.num_waiting if self.stats is not None else 0
        waiting = max(in_flight + num_seqs - self.info.max_num_seqs,
                      reported + num_seqs if reported else 0)
        if waiting > self.max_waiting_requests:
            raise Overloaded(
                f"the server is overloaded: {waiting - num_seqs} requests are waiting for the engine "
                f"(--max-waiting-requests {self.max_waiting_requests}); retry later",
                headers={"Retry-After": "1"})

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: Any) -> AsyncIterator[Any]:
        """Add a request to the engine and yield its ``RequestOutput``s until it finishes.
        Leaving early (an exception, a cancelled task, aclose()) aborts it in the engine."""
        from ortserve.engine.messages import EngineRequest

        self.check_ready()
        outputs: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[request_id] = outputs
        self._num_seqs[request_id] = params.n
        self._processor.add_request(request_id, prompt_token_ids, params)
        self._outgoing.put(AddRequest(EngineRequest(request_id=request_id,
                                                    prompt_token_ids=prompt_token_ids,
                                                    sampling_params=params)))
        finished = False
        try:
            while not finished:
                item = await outputs.get()
                if isinstance(item, Exception):
                    finished = True  # the engine has already dropped it
                    raise item
                finished = item.finished
                yield item
        finally:
            self._forget(request_id)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._forget(request_id)
        self._processor.abort_requests([request_id])
        self._outgoing.put(AbortRequests([request_id]))
        for observer in self.observers:
            observer.observe_finished("abort")

    def _forget(self, request_id: str) -> None:
        self._queues.pop(request_id, None)
        self._num_seqs.pop(request_id, None)

    # --- engine messages (on the event loop) ---------------------------------------------------

    def _on_message(self, message: Any) -> None:
        if isinstance(message, StepResult):
            self._on_step(message)
        elif isinstance(message, EngineReady):
            asyncio.ensure_future(self._finish_loading(message.info))
        elif isinstance(message, EngineFailed):
            prefix = "engine start-up failed" if message.during_startup else "engine failed"
            self._fail(f"{prefix}: {message.message}")

    async def _finish_loading(self, info: EngineInfo) -> None:
        try:
            tokenizer = await asyncio.to_thread(self.tokenizer_loader, info.artifact_dir)
            if self.output_processor is None:
                from ortserve.engine.output_processor import OutputProcessor

                self.output_processor = OutputProcessor
            self._processor = self.output_processor(tokenizer)
        except Exception as exc:  # noqa: BLE001 - reported like any start-up failure
            self._fail(f"loading the tokenizer from {info.artifact_dir} failed: {exc}")
            return
        self.info = info
        self.prompts = Prompts(tokenizer, info.max_model_len, info.vocab_size)
        if self.state == "loading":
            self.state = "ready"
            self.ready.set()
            logger.info("engine ready: %s (max_model_len %d)", info.artifact_dir, info.max_model_len)

    def _on_step(self, result: StepResult) -> None:
        for request_id, reason in result.rejected.items():
            self._deliver(request_id, BadRequest(reason))
            self._processor.abort_requests([request_id])
        request_outputs, to_abort = self._processor.process_outputs(result.outputs)
        for output in request_outputs:
            self._deliver(output.request_id, output)
            if output.finished:
                reasons = [c.finish_reason for c in output.outputs]
                for observer in self.observers:
                    observer.observe_finished(reasons[0] if reasons else None)
        if to_abort:  # finished by a stop string, which only the detokeniser sees
            self._outgoing.put(AbortRequests(list(to_abort)))
        if result.stats is not None:
            self.stats = result.stats
            for observer in self.observers:
                observer.observe_stats(result.stats)

    def _deliver(self, request_id: str, item: Any) -> None:
        outputs = self._queues.get(request_id)
        if outputs is not None:
            outputs.put_nowait(item)

    def _fail(self, message: str) -> None:
        if self.state in ("failed", "stopped"):
            return
        self.state = "failed"
        self.failure = message
        logger.error("%s", message)
        self._fail_all(EngineFailure(message))
        for callback in self.on_failure:
            callback(message)

    def _fail_all(self, error: Exception) -> None:
        for outputs in self._queues.values():
            outputs.put_nowait(error)

    # --- threads ------------------------------------------------------------------------------

    def _read_loop(self) -> None:
        assert self._process is not None and self._loop is not None
        while True:
            try:
                message = self._process.recv()
            except (EOFError, OSError):
                break
            self._loop.call_soon_threadsafe(self._on_message, message)
        self._process.process.join(2)
        code = self._process.process.exitcode
        try:
            self._loop.call_soon_threadsafe(
                self._fail, f"the engine process exited unexpectedly (exit code {code})")
        except RuntimeError:
            pass  # the loop is closed: we are exiting anyway

    def _write_loop(self) -> None:
        assert self._process is not None
        while (message := self._outgoing.get()) is not None:
            try:
                self._process.send(message)
            except OSError:
                break
