"""How to sample one request, and the one table of bounds that every entry point checks.

``BOUNDS`` is the only place a limit on a request parameter is written. ``SamplingParams`` checks
it in ``__post_init__`` (offline API, CLI, and the engine process, which decodes it from the wire);
the HTTP request models derive their pydantic/OpenAPI constraints from the same table
(``Bound.field_kwargs``), so a 400 over HTTP and a ``ValueError`` offline are the same rule.
``PromptLimits`` is the one check of a prompt against the model (length, token ids, room left).

Every failure is an ``InvalidParameter`` (a ValueError) whose ``param`` names the field and whose
message says the allowed range, so the server answers 400 naming the parameter.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

MAX_LOGPROBS = 20  # as OpenAI's top_logprobs and vLLM's default max_logprobs
GREEDY_TEMPERATURE = 1e-5  # a temperature below this samples greedily (vLLM's _SAMPLING_EPS)
INT32_MAX = 2**31 - 1
MAX_GRAMMAR_CHARS = 65_536  # a JSON schema (as JSON text), regex or grammar: bounds compilation work


class InvalidParameter(ValueError):
    """A request parameter outside its bounds; ``param`` names it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Bound:
    """Inclusive (ge/le) or exclusive (gt/lt) limits of a number, or of a list's or string's size."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    max_items: int | None = None  # lists and dicts
    max_length: int | None = None  # each string
    note: str = ""

    def holds(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        return (
            (self.ge is None or value >= self.ge)
            and (self.gt is None or value > self.gt)
            and (self.le is None or value <= self.le)
            and (self.lt is None or value < self.lt)
        )

    def describe(self) -> str:
        low = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else "(-inf"
        high = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else "inf)"
        return f"must be in {low}, {high}" + (f" ({self.note})" if self.note else "")

    def field_kwargs(self) -> dict[str, Any]:
        """The pydantic ``Field`` constraints of this bound (and so the OpenAPI schema's)."""
        names = ("ge", "gt", "le", "lt", "max_length")
        kwargs = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        if self.max_items is not None:
            kwargs["max_length"] = self.max_items  # pydantic's max_length bounds a list's size
        return kwargs


def _num(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


BOUNDS: dict[str, Bound] = {
    "n": Bound(ge=1, le=128),
    "temperature": Bound(ge=0.0, le=1e6, note="0 = greedy"),
    "top_p": Bound(gt=0.0, le=1.0),
    "top_k": Bound(ge=-1, le=INT32_MAX, note="0 or -1 = off"),
    "min_p": Bound(ge=0.0, le=1.0),
    "seed": Bound(ge=-(2**63), le=2**64 - 1),
    "presence_penalty": Bound(ge=-2.0, le=2.0),
    "frequency_penalty": Bound(ge=-2.0, le=2.0),
    "repetition_penalty": Bound(gt=0.0, le=2.0, note="1 = off"),
    "logit_bias": Bound(max_items=1024),
    "logit_bias_value": Bound(ge=-100.0, le=100.0),
    "stop": Bound(max_items=16, max_length=256),
    "stop_token_ids": Bound(max_items=64),
    "token_id": Bound(ge=0, le=INT32_MAX),
    "max_tokens": Bound(ge=1, le=INT32_MAX),
    "min_tokens": Bound(ge=0, le=INT32_MAX),
    "logprobs": Bound(ge=0, le=MAX_LOGPROBS, note="0 = only the sampled token"),
    "prompt_logprobs": Bound(ge=0, le=MAX_LOGPROBS, note="0 = only each prompt token's own"),
    "truncate_prompt_tokens": Bound(ge=1, le=INT32_MAX, note="keep the prompt's last k tokens"),
    "grammar": Bound(max_length=MAX_GRAMMAR_CHARS, note="a schema, regex or grammar as text"),
    "choice": Bound(max_items=1024, max_length=1024),
}


def check(param: str, value: float | None, bound: str | None = None) -> None:
    """Raise InvalidParameter unless ``value`` (None = unset) is within BOUNDS[bound or param]."""
    rule = BOUNDS[bound or param]
    if value is not None and not rule.holds(value):
        raise InvalidParameter(param, f"{param} {rule.describe()}, got {value!r}")


def check_size(param: str, items: Any, bound: str | None = None) -> None:
    rule = BOUNDS[bound or param]
    if items is not None and rule.max_items is not None and len(items) > rule.max_items:
        raise InvalidParameter(param, f"{param} has {len(items)} entries; at most {rule.max_items} are allowed")
    if rule.max_length is not None:
        for item in items or ():
            if len(item) > rule.max_length:
                raise InvalidParameter(
                    param, f"{param} entries must be at most {rule.max_length} characters, got one of {len(item)}"
                )


@dataclass
class StructuredOutputs:
    """What every sample must match (vLLM's ``StructuredOutputsParams``); exactly one is set.

    ``json``: a JSON schema (an object, or its JSON text); ``json_object``: any JSON object;
    ``regex``; ``choice``: one of these strings; ``grammar``: a Lark grammar (llguidance's
    syntax) or a GBNF/EBNF one (llama.cpp's). ``engine/grammar.py`` compiles it with llguidance.
    """

    json: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool = False

    def __post_init__(self) -> None:
        kinds = self.kinds()
        if len(kinds) != 1:
            found = ", ".join(kinds) or "none"
            raise InvalidParameter(
                "structured_outputs", f"structured_outputs needs exactly one of {', '.join(KINDS)}; got {found}"
            )
        text = self.json if not isinstance(self.json, dict) else json.dumps(self.json)
        for name, value in (("json", text), ("regex", self.regex), ("grammar", self.grammar)):
            if value is not None and len(value) > MAX_GRAMMAR_CHARS:
                raise InvalidParameter(
                    "structured_outputs",
                    f"structured_outputs.{name} is {len(value)} characters; at most {MAX_GRAMMAR_CHARS} are allowed",
                )
        if self.choice is not None:
            if not self.choice:
                raise InvalidParameter("structured_outputs", "structured_outputs.choice must not be empty")
            check_size("structured_outputs", self.choice, "choice")

    def kinds(self) -> list[str]:
        return [k for k in KINDS if getattr(self, k) not in (None, False)]

    @property
    def kind(self) -> str:
        return self.kinds()[0]


KINDS = ("json", "regex", "choice", "grammar", "json_object")


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 (or below GREEDY_TEMPERATURE) = greedy
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
    prompt_logprobs: int | None = None  # k top logprobs per prompt token (the first has none)
    structured_outputs: StructuredOutputs | None = None  # a grammar every sample must match
    truncate_prompt_tokens: int | None = None  # keep only the prompt's last k tokens (see truncate)
    # "delta": changes go out as they come (every --stream-interval tokens); "final_only": only the
    # first token and the end (vLLM's RequestOutputKind; the server's non-streaming requests)
    output_kind: Literal["delta", "final_only"] = "delta"

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.stop is not None:
            self.stop = [s for s in self.stop if s]  # an empty stop string would match everywhere
        if self.logit_bias is not None:
            self.logit_bias = {_token_id_key(k): float(v) for k, v in self.logit_bias.items()}
        if self.top_k == -1:
            self.top_k = 0
        for name in (
            "n",
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "seed",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
            "max_tokens",
            "min_tokens",
            "logprobs",
            "prompt_logprobs",
            "truncate_prompt_tokens",
        ):
            check(name, getattr(self, name))
        if self.output_kind not in ("delta", "final_only"):
            raise InvalidParameter(
                "output_kind", f"output_kind must be 'delta' or 'final_only', got {self.output_kind!r}"
            )
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputs(**self.structured_outputs)
        check_size("logit_bias", self.logit_bias)
        for token_id, bias in (self.logit_bias or {}).items():
            check("logit_bias", token_id, "token_id")
            check("logit_bias", bias, "logit_bias_value")
        check_size("stop", self.stop)
        check_size("stop_token_ids", self.stop_token_ids)
        for token_id in self.stop_token_ids or ():
            check("stop_token_ids", token_id, "token_id")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            # max_tokens always ends a choice; min_tokens only holds back EOS and stop conditions
            # until then (a rule between two fields that the OpenAPI schema could not state)
            self.min_tokens = self.max_tokens

    def truncate(self, prompt_token_ids: list[int]) -> list[int]:
        """The prompt the engine sees: its last ``truncate_prompt_tokens`` tokens (vLLM's rule),
        applied by whoever tokenizes (the server, the offline ``LLM``)."""
        k = self.truncate_prompt_tokens
        return list(prompt_token_ids) if k is None else list(prompt_token_ids[-k:])

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE or self.top_k == 1

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0


def _token_id_key(key: int | str) -> int:
    """logit_bias keys: ints, or decimal strings as JSON sends them ("²", "--5" and "007" are not)."""
    if isinstance(key, int):
        return key
    text = str(key)
    if not (text.isascii() and text.isdigit()) or len(text) > 9 or text != str(int(text)):
        raise InvalidParameter(
            "logit_bias", f"logit_bias keys must be token ids (up to 9 decimal digits, no leading zero), got {key!r}"
        )
    return int(text)


# generation_config.json keys that set the defaults of a request that leaves them out (vLLM's
# --generation-config auto): key -> SamplingParams field
GENERATION_CONFIG_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def model_sampling_defaults(folder: str | Path) -> dict[str, float | int]:
    """The sampling defaults the model's creator set in its generation_config.json: the values of
    GENERATION_CONFIG_KEYS it has, each within BOUNDS (a value out of bounds is left out)."""
    try:
        config = json.loads((Path(folder) / "generation_config.json").read_text())
    except (OSError, ValueError):
        return {}
    defaults: dict[str, float | int] = {}
    for key, name in GENERATION_CONFIG_KEYS.items():
        value = config.get(key) if isinstance(config, dict) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if name in ("top_k", "max_tokens") and value != int(value):
            continue
        try:
            check(name, value)
        except InvalidParameter:
            continue
        defaults[name] = int(value) if name in ("top_k", "max_tokens") else float(value)
    return defaults


@dataclass(frozen=True)
class PromptLimits:
    """A prompt against the model: token ids in the vocabulary, at least one token, and room for
    at least one generated token within max_model_len (prompt + completion)."""

    max_model_len: int
    vocab_size: int

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        bad = next((t for t in token_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidParameter(
                param, f"{param} holds token id {bad}, outside the vocabulary [0, {self.vocab_size})"
            )

    def completion_budget(self, prompt_len: int, max_tokens: int | None, param: str = "prompt") -> int:
        """The tokens this prompt may generate: ``max_tokens``, or all the room left if None or if
        ``max_tokens`` asks for more (then the choice ends at the context, finish_reason "length",
        as llama.cpp's server does)."""
        limit = self.max_model_len
        if prompt_len == 0:
            raise InvalidParameter(param, f"{param} is empty: at least one token is needed")
        if prompt_len >= limit:
            raise InvalidParameter(
                param,
                f"{param} is too long: {prompt_len} tokens, and this model's maximum context "
                f"length is {limit} tokens (prompt + completion; --max-model-len)",
            )
        room = limit - prompt_len
        return room if max_tokens is None else min(max_tokens, room)

    def check(self, prompt_token_ids: list[int], params: SamplingParams, param: str = "prompt") -> int:
        """Everything about a request that needs the model; returns its completion budget."""
        self.check_token_ids(prompt_token_ids, param)
        for name, ids in (("logit_bias", params.logit_bias or {}), ("stop_token_ids", params.stop_token_ids or ())):
            self.check_token_ids(list(ids), name)
        return self.completion_budget(len(prompt_token_ids), params.max_tokens, param)
