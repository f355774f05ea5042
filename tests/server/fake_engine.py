"""A stand-in engine core for the HTTP-layer tests: same interface as EngineCore, no model.

Each sample repeats its prompt's tokens (so the text is predictable), one token per step, at
most ``max_num_seqs`` requests run and the rest wait, and a step takes ``step_seconds``. Used
where the real model would only make a test slow: backpressure, errors, disconnects. It runs
inside the real ``LLMEngine`` (real detokenisation, stop strings and IPC). A request whose
prompt starts with ``FAULT_TOKEN`` fails in the core, as a request whose processing raised.
``max_generated`` ends every sample after that many tokens ("length"), so that a fake with a vast
context (schemathesis's) still answers each request quickly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ortserve.engine.ipc import EngineCoreOutput, EngineInfo, EngineRequest, StatsUpdate, TokenLogprob
from ortserve.engine.llm_engine import LLMEngine
from ortserve.sampling_params import PromptLimits
from ortserve.tokenizer import load_tokenizer

FAULT_TOKEN = 13


@dataclass
class _Running:
    request: EngineRequest
    generated: list[list[int]] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    start: float = field(default_factory=time.monotonic)


class FakeCore:
    def __init__(
        self,
        max_model_len: int = 256,
        max_num_seqs: int = 4,
        step_seconds: float = 0.02,
        eos_token_id: int = 2,
        fail_after_steps: int | None = None,
        max_generated: int = 2**62,
    ) -> None:
        self.fail_after_steps = fail_after_steps
        self.max_generated = max_generated
        self.num_steps = 0
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.step_seconds = step_seconds
        self.eos_token_id = eos_token_id
        self.waiting: list[_Running] = []
        self.running: list[_Running] = []
        self.totals = StatsUpdate()
        self.limits = PromptLimits(max_model_len, 49152)

    def info(self, tokenizer_dir: str = "") -> EngineInfo:
        return EngineInfo(
            artifact_dir=tokenizer_dir,
            max_model_len=self.max_model_len,
            vocab_size=49152,
            max_num_seqs=self.max_num_seqs,
        )

    def add_request(self, request: EngineRequest) -> None:
        self.limits.check(request.prompt_token_ids, request.sampling_params)
        n = request.sampling_params.n
        self.waiting.append(_Running(request, [[] for _ in range(n)], [False] * n))

    def abort_requests(self, request_ids: list[str]) -> None:
        ids = set(request_ids)
        self.waiting = [r for r in self.waiting if r.request.request_id not in ids]
        self.running = [r for r in self.running if r.request.request_id not in ids]

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def step(self) -> list[EngineCoreOutput]:
        time.sleep(self.step_seconds)
        self.num_steps += 1
        if self.fail_after_steps is not None and self.num_steps > self.fail_after_steps:
            raise RuntimeError("fake engine failure for the test")
        while self.waiting and len(self.running) < self.max_num_seqs:
            self.running.append(self.waiting.pop(0))
        outputs = []
        for state in [s for s in self.running if s.request.prompt_token_ids[0] == FAULT_TOKEN]:
            self.running.remove(state)
            outputs += [
                EngineCoreOutput(state.request.request_id, i, [], None, "error") for i in range(len(state.generated))
            ]
        for state in self.running:
            req = state.request
            params = req.sampling_params
            prompt = req.prompt_token_ids
            for i, tokens in enumerate(state.generated):
                if state.done[i]:
                    continue
                token = prompt[(len(tokens) + i) % len(prompt)]
                tokens.append(token)
                self.totals.generation_tokens += 1
                reason = None
                stop_reason = None
                if params.stop_token_ids and token in params.stop_token_ids:
                    reason, stop_reason = "stop", token
                elif len(tokens) >= min(params.max_tokens or self.max_model_len - len(prompt), self.max_generated):
                    reason = "length"
                logprobs = None
                if params.logprobs is not None:
                    top = [(token, -0.25), (self.eos_token_id, -1.5)][: params.logprobs]
                    logprobs = [TokenLogprob(logprob=-0.25, rank=1, top_logprobs=top)]
                outputs.append(
                    EngineCoreOutput(req.request_id, i, [token], logprobs, reason, stop_reason, len(prompt), 0)
                )
                state.done[i] = reason is not None
            if len(state.generated[0]) == 1:
                self.totals.prompt_tokens += len(prompt)
                self.totals.ttft.append(time.monotonic() - state.start)
        for state in [s for s in self.running if all(s.done)]:
            self.running.remove(state)
            self.totals.e2e.append(time.monotonic() - state.start)
        return outputs

    def stats(self) -> StatsUpdate:
        s = self.totals
        out = StatsUpdate(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_usage=len(self.running) / self.max_num_seqs,
            prompt_tokens=s.prompt_tokens,
            generation_tokens=s.generation_tokens,
            ttft=s.ttft,
            e2e=s.e2e,
        )
        self.totals = StatsUpdate()
        return out


@dataclass
class FakeEngineFactory:
    """Picklable (spawn): builds a FakeCore in the engine process; ``tokenizer_dir`` stands in
    for the artifact, since the HTTP side only reads its tokenizer. ``fail`` = a start-up error."""

    tokenizer_dir: str
    max_model_len: int = 256
    max_num_seqs: int = 4
    step_seconds: float = 0.02
    fail: str | None = None
    load_seconds: float = 0.0
    fail_after_steps: int | None = None
    max_generated: int = 2**62

    def __call__(self, config: object) -> LLMEngine:
        time.sleep(self.load_seconds)
        if self.fail:
            raise ValueError(self.fail)
        core = FakeCore(
            self.max_model_len,
            self.max_num_seqs,
            self.step_seconds,
            fail_after_steps=self.fail_after_steps,
            max_generated=self.max_generated,
        )
        core.info = lambda: FakeCore.info(core, self.tokenizer_dir)  # type: ignore[method-assign]
        return LLMEngine(core, load_tokenizer(self.tokenizer_dir))
