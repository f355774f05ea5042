"""The small typed messages between the HTTP process and the engine process (DESIGN.md §5).

Requests in, token deltas out; all are picklable dataclasses sent over ``multiprocessing`` pipes.
The engine's own types (``EngineRequest``, ``EngineCoreOutput``, ``EngineStats``) travel inside.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# --- server -> engine ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AddRequest:
    request: Any  # ortserve.engine.core.EngineRequest


@dataclass(frozen=True)
class AbortRequests:
    request_ids: list[str]


@dataclass(frozen=True)
class Shutdown:
    """Stop after this message; in-flight requests are dropped (the server drains first)."""


# --- engine -> server ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineInfo:
    """What the HTTP side needs to know about the loaded model."""

    artifact_dir: str
    max_model_len: int
    vocab_size: int
    max_num_seqs: int
    num_blocks: int = 0
    block_size: int = 0
    eos_token_ids: list[int] = field(default_factory=list)
    engine_cores: list[int] = field(default_factory=list)  # pinned inference cores; [] = not pinned


@dataclass(frozen=True)
class EngineReady:
    info: EngineInfo


@dataclass(frozen=True)
class EngineFailed:
    """Start-up failed (``during_startup``) or a step raised; the engine process exits."""

    message: str
    during_startup: bool


@dataclass(frozen=True)
class StepResult:
    """One engine step: new tokens of every running request, the stats after the step, and the
    requests the core refused (request id -> reason naming the limit)."""

    outputs: list[Any]  # list[EngineCoreOutput]
    stats: Any  # EngineStats
    rejected: dict[str, str] = field(default_factory=dict)
