"""How to sample one request: a plain dataclass shared by the offline API, the server and the engine.

Every field is checked in ``__post_init__``; a bad value raises ``ValueError`` whose message names
the field and the allowed range, so the server can answer 400 naming the parameter.
Fields that need the vocabulary (token ids in ``logit_bias`` and ``stop_token_ids``) are checked
by the engine core when the request is added.
"""
from __future__ import annotations

from dataclasses import dataclass

MAX_LOGPROBS = 20  # as OpenAI's top_logprobs and vLLM's default max_logprobs
GREEDY_TEMPERATURE = 1e-5  # a temperature below this samples greedily (vLLM's _SAMPLING_EPS)


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 = off
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    stop: list[str] | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    max_tokens: int | None = 16  # None = up to max_model_len
    min_tokens: int = 0
    ignore_eos: bool = False
    logprobs: int | None = None  # k top logprobs per token; 0 = only the sampled token's
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            self.stop = [s for s in self.stop if s]  # an empty stop string would match everywhere
        if self.logit_bias is not None:  # JSON gives string keys
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()}
        if self.top_k == -1:
            self.top_k = 0
        _check(self.n >= 1, "n", "must be >= 1", self.n)
        _check(self.temperature >= 0.0, "temperature", "must be >= 0 (0 = greedy)", self.temperature)
        _check(0.0 < self.top_p <= 1.0, "top_p", "must be in (0, 1]", self.top_p)
        _check(self.top_k >= 0, "top_k", "must be >= 1, or 0 or -1 to disable", self.top_k)
        _check(0.0 <= self.min_p <= 1.0, "min_p", "must be in [0, 1]", self.min_p)
        _check(-2.0 <= self.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]",
               self.presence_penalty)
        _check(-2.0 <= self.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]",
               self.frequency_penalty)
        _check(0.0 < self.repetition_penalty <= 2.0, "repetition_penalty", "must be in (0, 2]",
               self.repetition_penalty)
        for token_id, bias in (self.logit_bias or {}).items():
            _check(token_id >= 0, "logit_bias", "keys must be token ids >= 0", token_id)
            _check(-100.0 <= bias <= 100.0, "logit_bias", "values must be in [-100, 100]", bias)
        for token_id in self.stop_token_ids or ():
            _check(token_id >= 0, "stop_token_ids", "must be token ids >= 0", token_id)
        _check(self.max_tokens is None or self.max_tokens >= 1, "max_tokens", "must be >= 1",
               self.max_tokens)
        _check(self.min_tokens >= 0, "min_tokens", "must be >= 0", self.min_tokens)
        _check(self.max_tokens is None or self.min_tokens <= self.max_tokens, "min_tokens",
               f"must be <= max_tokens ({self.max_tokens})", self.min_tokens)
        _check(self.logprobs is None or 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
               f"must be in [0, {MAX_LOGPROBS}]", self.logprobs)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def needs_penalties(self) -> bool:
        return (self.presence_penalty != 0.0 or self.frequency_penalty != 0.0
                or self.repetition_penalty != 1.0)


def _check(ok: bool, field: str, rule: str, value) -> None:
    if not ok:
        raise ValueError(f"{field} {rule}, got {value!r}")
