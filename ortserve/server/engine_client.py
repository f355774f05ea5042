"""The HTTP process's handle on the engine process: admission, routing, supervision.

- **Admission** happens when a request is accepted (``submit``, synchronous): over
  --max-waiting-requests waiting sequences or --max-queued-tokens queued prompt tokens it is a
  429 with Retry-After; while the engine is down it is a 503 with Retry-After.
- **Routing**: one reader thread turns the engine's messages into event-loop callbacks, one writer
  thread per engine process sends ours (a send must never block the event loop). Each request has
  an ``asyncio.Queue`` of ``RequestDelta``s; leaving its stream early aborts it in the engine.
- **Supervision**: if the engine process dies, in-flight requests get an error, /health is 503,
  and the engine is restarted, at most ``max_restarts`` times in ``restart_window`` seconds; then
  the server stops with one log line. If the engine makes no progress for ``engine_timeout``
  seconds while work is pending, /health is 503 ("stalled") and a metric counts it.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from ortserve.engine.config import EngineConfig
from ortserve.engine.ipc import (
    AbortRequests,
    AddRequest,
    EngineFailed,
    EngineInfo,
    EngineReady,
    EngineRequest,
    ErrorCode,
    Message,
    RequestDelta,
    StatsUpdate,
    StepResult,
)
from ortserve.sampling_params import PromptLimits, SamplingParams, model_sampling_defaults
from ortserve.tokenizer import ChatPrompts, load_tokenizer

from .engine_process import EngineFactory, EngineProcess, build_llm_engine
from .errors import BadRequest, EngineFailure, EngineUnavailable, Overloaded

logger = logging.getLogger("ortserve.server")

State = Literal["loading", "ready", "stalled", "restarting", "failed", "stopped"]
RETRY_AFTER = {"Retry-After": "1"}


class EngineObserver(Protocol):
    def observe_stats(self, stats: StatsUpdate) -> None: ...
    def observe_finished(self, reason: str | None) -> None: ...
    def observe_engine_event(self, event: str) -> None: ...


@dataclass
class Supervision:
    max_waiting_requests: int = 256
    max_queued_tokens: int = 1 << 20
    engine_timeout: float = 60.0  # seconds without progress while work is pending
    max_restarts: int = 5
    restart_window: float = 300.0  # seconds
    allow_special_tokens_in_content: bool = False


@dataclass
class _InFlight:
    outputs: asyncio.Queue[RequestDelta | Exception]
    num_seqs: int
    prompt_tokens: int
    started: bool = False


@dataclass
class _Engine:
    """One engine process and its two pipe threads."""

    process: EngineProcess
    outgoing: queue.SimpleQueue[Message | None] = field(default_factory=queue.SimpleQueue)
    threads: list[threading.Thread] = field(default_factory=list)


class EngineClient:
    def __init__(
        self,
        config: EngineConfig,
        supervision: Supervision | None = None,
        factory: EngineFactory = build_llm_engine,
        tokenizer_loader: Callable[..., Any] = load_tokenizer,
    ) -> None:
        self.config = config
        self.supervision = supervision or Supervision()
        self.factory = factory
        self.tokenizer_loader = tokenizer_loader
        self.state: State = "loading"
        self.failure: str | None = None
        self.info: EngineInfo | None = None
        self.prompts: ChatPrompts | None = None
        self.limits: PromptLimits | None = None
        self.sampling_defaults: dict[str, Any] = {}  # the model's, for fields a request leaves out
        self.ready = asyncio.Event()
        self.observers: list[EngineObserver] = []
        self.on_failure: list[Callable[[str], None]] = []
        self.num_restarts = 0
        self._restarts: list[float] = []
        self._requests: dict[str, _InFlight] = {}
        self._engine: _Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_progress = time.monotonic()
        self._watchdog: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Future[None]] = set()

    # --- life cycle --------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engine process; returns at once, ``ready`` is set when the model is loaded."""
        self._loop = asyncio.get_running_loop()
        await self._spawn()
        self._watchdog = asyncio.create_task(self._watch())

    async def _spawn(self) -> None:
        process = await asyncio.to_thread(EngineProcess, self.config, self.factory)
        logger.info("engine process started (pid %s)", process.pid)
        engine = self._engine = _Engine(process)
        for target, name in ((self._read_loop, "engine-reader"), (self._write_loop, "engine-writer")):
            thread = threading.Thread(target=target, args=(engine,), name=name, daemon=True)
            thread.start()
            engine.threads.append(thread)

    async def shutdown(self, timeout: float = 10.0) -> None:
        if self.state == "stopped":
            return
        self.state = "stopped"
        if self._watchdog is not None:
            self._watchdog.cancel()
        self.fail_all(EngineUnavailable("the server is shutting down"))
        engine = self._engine
        if engine is not None:
            engine.outgoing.put(None)  # the writer sends what is queued, then stops
            await asyncio.to_thread(engine.threads[1].join, timeout)
            code = await asyncio.to_thread(engine.process.close, timeout)
            logger.info("engine process exited with code %s", code)

    @property
    def engine_pid(self) -> int | None:
        return self._engine.process.pid if self._engine else None

    # --- requests ----------------------------------------------------------------------------

    def check_ready(self) -> tuple[ChatPrompts, PromptLimits]:
        if self.state in ("ready", "stalled") and self.prompts is not None and self.limits is not None:
            return self.prompts, self.limits
        if self.state == "loading":
            raise EngineUnavailable("the model is still loading; retry shortly (GET /health)", headers=RETRY_AFTER)
        if self.state == "restarting":
            raise EngineUnavailable("the engine is restarting after a failure; retry shortly", headers=RETRY_AFTER)
        raise EngineUnavailable(f"the engine is not running ({self.state})")

    def check_fits(self, num_seqs: int, asked: str) -> None:
        """A 400 for a request of more sequences than the server ever holds at once (running and
        waiting): a 429 would have its client retry for ever. ``asked``: how the request asked, for
        the message ("n 64", "200 prompts x n 128")."""
        assert self.info is not None
        most = self.info.max_num_seqs + self.supervision.max_waiting_requests
        if num_seqs > most:
            raise BadRequest(
                f"this request asks for {num_seqs} sequences ({asked}), more than the {most} this server "
                f"holds at once ({self.info.max_num_seqs} running, --max-num-seqs, and "
                f"{self.supervision.max_waiting_requests} waiting, --max-waiting-requests); "
                "send fewer prompts or a smaller n in each request",
                "n",
            )

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> RequestStream:
        """Admit a request (now, not when its stream is first read) and send it to the engine."""
        self.check_ready()
        self.check_fits(params.n, f"n {params.n}")
        self._admit(len(prompt_token_ids), params.n)
        assert self._engine is not None
        request = self._requests[request_id] = _InFlight(asyncio.Queue(), params.n, len(prompt_token_ids) * params.n)
        self._engine.outgoing.put(AddRequest(EngineRequest(request_id, prompt_token_ids, params)))
        return RequestStream(self, request_id, request.outputs)

    def _admit(self, prompt_tokens: int, num_seqs: int) -> None:
        limits, info = self.supervision, self.info
        assert info is not None
        in_flight = sum(r.num_seqs for r in self._requests.values())
        waiting = in_flight + num_seqs - info.max_num_seqs
        if waiting > limits.max_waiting_requests:
            raise Overloaded(
                f"the server is overloaded: {in_flight} sequences are in flight and at most "
                f"{limits.max_waiting_requests} may wait beyond the {info.max_num_seqs} that run "
                f"(--max-waiting-requests); retry later",
                headers=RETRY_AFTER,
            )
        queued = sum(r.prompt_tokens for r in self._requests.values() if not r.started)
        if queued and queued + prompt_tokens * num_seqs > limits.max_queued_tokens:
            raise Overloaded(
                f"the server is overloaded: {queued} prompt tokens are queued and "
                f"--max-queued-tokens is {limits.max_queued_tokens}; retry later",
                headers=RETRY_AFTER,
            )

    def abort(self, request_id: str) -> None:
        if self._requests.pop(request_id, None) is None:
            return
        if self._engine is not None:
            self._engine.outgoing.put(AbortRequests([request_id]))
        for observer in self.observers:
            observer.observe_finished("abort")

    def fail_all(self, error: Exception) -> None:
        """End every in-flight request with ``error`` (their streams report it)."""
        requests, self._requests = self._requests, {}
        for request in requests.values():
            request.outputs.put_nowait(error)

    @property
    def num_in_flight(self) -> int:
        return len(self._requests)

    # --- engine messages (on the event loop) ---------------------------------------------------

    def _on_message(self, message: Message) -> None:
        self._last_progress = time.monotonic()
        if self.state == "stalled":
            self.state = "ready"
            logger.warning("the engine made progress again")
        if isinstance(message, StepResult):
            self._on_step(message)
        elif isinstance(message, EngineReady):
            self._keep(self._on_ready(message.info))
        elif isinstance(message, EngineFailed):
            logger.error("engine %s: %s", message.code.value, message.message)
            if message.code is ErrorCode.STARTUP:
                self._fail(f"engine start-up failed: {message.message}")

    async def _on_ready(self, info: EngineInfo) -> None:
        if self.prompts is None:
            try:
                tokenizer = await asyncio.to_thread(self.tokenizer_loader, info.artifact_dir, self.config.chat_template)
            except Exception as exc:  # noqa: BLE001 - reported like any start-up failure
                self._fail(f"loading the tokenizer from {info.artifact_dir} failed: {exc}")
                return
            self.prompts = ChatPrompts(tokenizer, self.supervision.allow_special_tokens_in_content)
            if self.config.generation_config == "auto":
                self.sampling_defaults = model_sampling_defaults(info.artifact_dir)
            if self.sampling_defaults:
                logger.info(
                    "request defaults from the model's generation_config.json: %s (not with --generation-config vllm)",
                    ", ".join(f"{k}={v}" for k, v in self.sampling_defaults.items()),
                )
        self.info = info
        self.limits = PromptLimits(info.max_model_len, info.vocab_size)
        if self.state in ("loading", "restarting"):
            self.state = "ready"
            self.ready.set()
            logger.info("engine ready: %s (max_model_len %d)", info.artifact_dir, info.max_model_len)

    def _on_step(self, result: StepResult) -> None:
        for error in result.errors:
            bad = (
                BadRequest(error.message)
                if error.code is ErrorCode.INVALID_REQUEST
                else EngineFailure(f"internal error (request {error.request_id})")
            )
            self._finish(error.request_id, bad)
        for delta in result.deltas:
            request = self._requests.get(delta.request_id)
            if request is None:
                continue
            request.started = True
            failed = delta.error is not None or any(s.finish_reason == "error" for s in delta.samples)
            if failed:
                self._finish(delta.request_id, EngineFailure(f"internal error (request {delta.request_id})"))
                continue
            request.outputs.put_nowait(delta)
            if delta.finished:
                self._requests.pop(delta.request_id, None)
                reason = next((s.finish_reason for s in delta.samples if s.finish_reason), None)
                for observer in self.observers:
                    observer.observe_finished(reason)
        if result.stats is not None:
            for observer in self.observers:
                observer.observe_stats(result.stats)

    def _finish(self, request_id: str, error: Exception) -> None:
        request = self._requests.pop(request_id, None)
        if request is not None:
            request.outputs.put_nowait(error)

    def _fail(self, message: str) -> None:
        if self.state in ("failed", "stopped"):
            return
        self.state = "failed"
        self.failure = message
        logger.error("%s", message)
        self.fail_all(EngineUnavailable("the engine is not running"))
        for callback in self.on_failure:
            callback(message)

    def _on_engine_exit(self, engine: _Engine, code: int | None) -> None:
        if engine is not self._engine or self.state in ("failed", "stopped"):
            return
        logger.error("the engine process exited unexpectedly (exit code %s)", code)
        for observer in self.observers:
            observer.observe_engine_event("death")
        self.fail_all(EngineFailure("the engine process failed while serving this request; retry"))
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < self.supervision.restart_window] + [now]
        if self.state == "loading" or len(self._restarts) > self.supervision.max_restarts:
            self._fail(
                f"the engine process died {len(self._restarts)} times in "
                f"{self.supervision.restart_window:g} s (--max-engine-restarts "
                f"{self.supervision.max_restarts}); giving up"
                if self.state != "loading"
                else f"the engine process exited during start-up (exit code {code})"
            )
            return
        self.state = "restarting"
        self.num_restarts += 1
        engine.outgoing.put(None)
        self._keep(self._spawn())

    def _keep(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task that is referenced until it ends (the loop keeps only weak ones)."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self) -> None:
        """Flag an engine that makes no progress while requests are pending."""
        timeout = self.supervision.engine_timeout
        while True:
            await asyncio.sleep(min(1.0, timeout / 4))
            idle = time.monotonic() - self._last_progress
            if self.state == "ready" and self._requests and idle > timeout:
                self.state = "stalled"
                logger.error(
                    "the engine made no progress for %.0f s with %d requests pending (--engine-timeout)",
                    idle,
                    len(self._requests),
                )
                for observer in self.observers:
                    observer.observe_engine_event("stall")
            elif not self._requests:
                self._last_progress = time.monotonic()

    # --- threads ------------------------------------------------------------------------------

    def _read_loop(self, engine: _Engine) -> None:
        assert self._loop is not None
        while True:
            try:
                message = engine.process.recv()
            except (EOFError, OSError):
                break
            self._loop.call_soon_threadsafe(self._on_message, message)
        engine.process.process.join(2)
        try:
            self._loop.call_soon_threadsafe(self._on_engine_exit, engine, engine.process.process.exitcode)
        except RuntimeError:
            pass  # the loop is closed: we are exiting anyway

    @staticmethod
    def _write_loop(engine: _Engine) -> None:
        while (message := engine.outgoing.get()) is not None:
            try:
                engine.process.send(message)
            except OSError:
                break


class RequestStream:
    """One request's deltas, until it finishes. Closing it early (an exception, a cancelled
    task, ``aclose()``) aborts the request in the engine."""

    def __init__(self, client: EngineClient, request_id: str, outputs: asyncio.Queue[RequestDelta | Exception]) -> None:
        self.client = client
        self.request_id = request_id
        self.outputs = outputs
        self.finished = False

    def __aiter__(self) -> AsyncIterator[RequestDelta]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestDelta]:
        try:
            while not self.finished:
                item = await self.outputs.get()
                if isinstance(item, Exception):
                    self.finished = True  # the engine has already dropped it
                    raise item
                self.finished = item.finished
                yield item
        finally:
            if not self.finished:
                self.client.abort(self.request_id)

    async def aclose(self) -> None:
        if not self.finished:
            self.finished = True
            self.client.abort(self.request_id)
