"""The typed messages between the API process and the engine process (docs/design.md §5).

msgspec structs, as vLLM v1 uses between its processes: each side encodes one tagged union and
decodes the other, so a field that one side renames fails at the boundary, not deep in a handler.
This module imports nothing heavy, so the HTTP process can use it without onnxruntime.

- API -> engine: ``AddRequest``, ``AbortRequests``, ``Shutdown``.
- engine -> API: ``EngineReady`` once, then one ``StepResult`` per step (request deltas, the
  stats that changed, and per-request errors), or ``EngineFailed`` before the process exits.
"""

from __future__ import annotations

import enum
import time
from typing import Literal

import msgspec

from ortserve.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "abort", "error"]


class ErrorCode(enum.Enum):
    """Why a request or the engine failed; the API side maps each to an HTTP status."""

    INVALID_REQUEST = "invalid_request"  # 400: the request can never be served (too long, bad id)
    INTERNAL = "internal"  # 500: processing this request raised; the engine goes on
    STARTUP = "startup"  # the engine could not start (the message says what to change)
    CRASHED = "crashed"  # the engine loop itself raised; the process exits


class Message(msgspec.Struct, tag=True, omit_defaults=True):
    """Base of every message: tagged, so each side decodes one union of them."""


# --- engine-internal records that also cross the boundary ----------------------------------------


class TokenLogprob(msgspec.Struct, array_like=True):
    """Logprobs of one generated token, from the model's raw logits (before penalties,
    temperature and truncation, as vLLM v1 reports them)."""

    logprob: float  # of the sampled token
    rank: int  # 1 = the most likely token
    top_logprobs: list[tuple[int, float]]  # (token id, logprob), most likely first; k entries


class EngineRequest(msgspec.Struct):
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = msgspec.field(default_factory=time.monotonic)  # time.monotonic() seconds


class EngineCoreOutput(msgspec.Struct, omit_defaults=True):
    """New tokens of one sample of one request, from one core step."""

    request_id: str
    index: int  # sample index in 0..n-1
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprob] | None = None  # one per new token when logprobs were asked
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the stop token id (stop strings: the output processor)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    # with the first token of sample 0, when prompt logprobs were asked: one per prompt token
    # after the first (the first has no context to be predicted from)
    prompt_logprobs: list[TokenLogprob] | None = None
    finished_by_grammar: bool = False  # the grammar ended on an ordinary token: its text is kept

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class SampleDelta(msgspec.Struct, omit_defaults=True):
    """What one sample gained in one step, after detokenisation and stop strings."""

    index: int
    text: str = ""
    token_ids: list[int] = []
    logprobs: list[TokenLogprob] | None = None  # one per token id, when logprobs were asked
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class RequestDelta(msgspec.Struct, omit_defaults=True):
    """One request's samples that changed in one step; ``finished`` once all of them are."""

    request_id: str
    samples: list[SampleDelta]
    finished: bool = False
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    error: str | None = None  # set with finished=True when processing this request raised
    prompt_logprobs: list[TokenLogprob] | None = None  # once, in the request's first delta (see EngineCoreOutput)


class StatsUpdate(msgspec.Struct, omit_defaults=True):
    """The engine's gauges after a step, and what its counters gained during it; fields that did
    not change are left out on the wire (omit_defaults)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks held by requests, 0..1
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache
    prefix_hits: int = 0  # of which found
    num_preemptions: int = 0
    num_draft_tokens: int = 0  # speculative draft tokens proposed
    num_accepted_tokens: int = 0  # of which the target model kept
    prompt_tokens: int = 0  # prompt tokens of requests that produced their first token
    generation_tokens: int = 0
    num_steps: int = 0
    step_seconds: float = 0.0  # wall time inside step()
    model_seconds: float = 0.0  # of which inside session.run
    # latencies of requests finished during the step (seconds)
    ttft: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []


class EngineInfo(msgspec.Struct):
    """What the API side needs to know about the loaded model."""

    artifact_dir: str
    max_model_len: int
    vocab_size: int
    max_num_seqs: int
    engine_cores: list[int] = []  # pinned inference cores; [] = not pinned


class RequestError(msgspec.Struct):
    request_id: str
    code: ErrorCode
    message: str


# --- API -> engine ---------------------------------------------------------------------------------


class AddRequest(Message):
    request: EngineRequest


class AbortRequests(Message):
    request_ids: list[str]


class Shutdown(Message):
    """Stop after this message; in-flight requests are dropped (the server drains first)."""


# --- engine -> API ---------------------------------------------------------------------------------


class EngineReady(Message):
    info: EngineInfo


class EngineFailed(Message):
    """Start-up failed (STARTUP) or the loop raised (CRASHED); the engine process exits."""

    code: ErrorCode
    message: str


class StepResult(Message):
    deltas: list[RequestDelta] = []
    stats: StatsUpdate | None = None
    errors: list[RequestError] = []  # requests refused or failed without a delta


ToEngine = AddRequest | AbortRequests | Shutdown
FromEngine = EngineReady | EngineFailed | StepResult


class Channel:
    """msgpack encoding of one direction's union, over a ``multiprocessing`` Connection."""

    def __init__(self, send_type: object, recv_type: object) -> None:
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(recv_type)

    def encode(self, message: Message) -> bytes:
        return self._encoder.encode(message)

    def decode(self, data: bytes) -> Message:
        message: Message = self._decoder.decode(data)
        return message


def engine_side() -> Channel:
    return Channel(FromEngine, ToEngine)


def api_side() -> Channel:
    return Channel(ToEngine, FromEngine)
