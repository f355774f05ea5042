"""The small typed messages between the API side and the engine core (DESIGN §5).

They cross a process boundary in the server, so they are plain picklable dataclasses and this
module imports nothing heavy: the HTTP process can import it without onnxruntime.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Literal

from ortserve.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "abort"]


class RequestRejected(ValueError):
    """A request the engine can never serve (too long, bad token id): answer 400, the message
    names the limit and the flag or field that changes it."""


@dataclass
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)  # time.monotonic() seconds


@dataclass
class TokenLogprob:
    """Logprobs of one generated token, from the model's raw logits (before penalties,
    temperature and truncation, as vLLM v1 reports them)."""

    logprob: float  # of the sampled token
    rank: int  # 1 = the most likely token
    top_logprobs: list[tuple[int, float]]  # (token id, logprob), most likely first; k entries


@dataclass
class EngineCoreOutput:
    request_id: str
    index: int  # sample index in 0..n-1
    new_token_ids: list[int]
    new_logprobs: list[TokenLogprob] | None = None  # one per new token when logprobs were asked
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None  # the stop token id (stop strings: the output processor)
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_usage: float = 0.0  # fraction of KV blocks held by requests, 0..1
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache (cumulative)
    prefix_hits: int = 0  # of which found (cumulative)
    num_preemptions: int = 0  # cumulative
    prompt_tokens: int = 0  # prompt tokens of requests that produced their first token (cumulative)
    generation_tokens: int = 0  # cumulative
    num_steps: int = 0  # cumulative
    step_seconds: float = 0.0  # wall time inside step() (cumulative)
    model_seconds: float = 0.0  # of which inside session.run (cumulative)
    # per finished request, drained since the previous stats() call (seconds)
    ttft: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    e2e: list[float] = field(default_factory=list)
