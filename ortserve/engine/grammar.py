"""Structured outputs with llguidance: grammars, one matcher per sample, and a token mask per step.

- ``grammar_text(spec)``: a ``StructuredOutputs`` as llguidance's grammar. JSON schemas are
  written with fixed separators (``", "`` and ``": "``, no other whitespace): a small model cannot
  wander into endless whitespace, and the output still reads as ordinary JSON.
- ``check(spec)``: compile-check the grammar without a tokenizer and raise ``InvalidParameter``
  naming the problem. The server calls it off its event loop before sending a request.
- ``GrammarCompiler`` (engine process): the llguidance tokenizer (built once from the Hugging
  Face tokenizer, in the background at start-up) and a bounded cache of compiled matchers keyed by
  the grammar text; each sample gets a deep copy of the compiled one (a copy takes microseconds,
  compiling can take milliseconds).
- ``MaskWorker``: fills the step's token bitmask in a worker thread, started before the model
  runs (ONNX Runtime and llguidance both release the GIL) and joined before sampling.

The matcher advances only with sampled tokens. Preemption recomputes KV but never re-samples, so
a matcher survives it unchanged.
"""

from __future__ import annotations

import json
import logging
import os
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
from llguidance.numpy import fill_next_token_bitmask_par

from ortserve.sampling_params import InvalidParameter, StructuredOutputs

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

logger = logging.getLogger("ortserve.engine")

JSON_OPTIONS: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
CACHE_SIZE = 64  # compiled grammars kept
# llguidance's defaults are generous; these bound the work one grammar can cost per step and at
# compile time (a few ms each on one core), so a hostile schema cannot stall the engine.
STEP_LEXER_FUEL, STEP_MAX_ITEMS, INITIAL_LEXER_FUEL, MAX_GRAMMAR_SIZE = 200_000, 50_000, 1_000_000, 200_000


def grammar_text(spec: StructuredOutputs) -> str:
    """The llguidance grammar of ``spec``; raises InvalidParameter if it cannot be written."""
    try:
        if spec.json is not None:
            schema = json.loads(spec.json) if isinstance(spec.json, str) else spec.json
            if not isinstance(schema, dict):
                raise ValueError("a JSON schema must be an object")
            bounded = _bounded_integers(_wide_ints_as_floats(schema))
            return str(llguidance.LLMatcher.grammar_from_json_schema(bounded, defaults=JSON_OPTIONS))
        if spec.json_object:
            return str(llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS))
        if spec.regex is not None:
            return str(llguidance.LLMatcher.grammar_from_regex(spec.regex))
        if spec.choice is not None:
            return str(llguidance.grammar_from("choice", json.dumps(spec.choice)))
    except ValueError as exc:  # json.JSONDecodeError is one
        raise InvalidParameter("structured_outputs", f"structured_outputs.{spec.kind} is invalid: {exc}") from exc
    assert spec.grammar is not None
    try:
        return str(llguidance.grammar_from("grammar", spec.grammar))  # Lark, or GBNF converted to Lark
    except Exception as exc:
        raise InvalidParameter("structured_outputs", f"structured_outputs.grammar is invalid: {exc}") from exc


def _wide_ints_as_floats(value: Any) -> Any:
    """JSON has no integer width; llguidance's numbers are 64-bit, so wider integers go as floats."""
    if isinstance(value, dict):
        return {key: _wide_ints_as_floats(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_wide_ints_as_floats(item) for item in value]
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**64:
        return float(value)
    return value


INTEGER_DIGITS = 16  # llama.cpp's JSON grammars allow as many: 2^53, the largest exact in a double, has 16
_LITERALS = ("const", "enum", "default", "examples")  # values, not schemas: never rewritten


def _bounded_integers(schema: Any) -> Any:
    """Every integer without bounds gets at most INTEGER_DIGITS digits, as in llama.cpp's grammars:
    JSON itself has no bound, and a small model can repeat a digit until max_tokens (seen: SmolLM2
    on the openai client's ``parse`` of a {name: str, population: int} model wrote 300 "1"s)."""
    if isinstance(schema, list):
        return [_bounded_integers(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: value if key in _LITERALS else _bounded_integers(value) for key, value in schema.items()}
    kind = out.get("type")
    is_integer = kind == "integer" or (isinstance(kind, list) and "integer" in kind and "number" not in kind)
    if is_integer and "const" not in out and "enum" not in out:
        largest = 10**INTEGER_DIGITS - 1
        if "minimum" not in out and "exclusiveMinimum" not in out:
            out["minimum"] = -largest
        if "maximum" not in out and "exclusiveMaximum" not in out:
            out["maximum"] = largest
    return out


def _limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(
        step_lexer_fuel=STEP_LEXER_FUEL,
        step_max_items=STEP_MAX_ITEMS,
        initial_lexer_fuel=INITIAL_LEXER_FUEL,
        max_grammar_size=MAX_GRAMMAR_SIZE,
        verbose_errors=False,
    )


def check(spec: StructuredOutputs) -> None:
    """Raise InvalidParameter naming what llguidance rejects in ``spec`` (no tokenizer needed)."""
    error = _validation_error(grammar_text(spec))
    if error:
        raise InvalidParameter("structured_outputs", f"structured_outputs.{spec.kind} is invalid: {error.strip()}")


@lru_cache(maxsize=256)  # a client that repeats its schema pays for the check once
def _validation_error(text: str) -> str:
    return str(llguidance.LLMatcher.validate_grammar(text, None, limits=_limits()))


class GrammarCompiler:
    """Compiles grammars for one tokenizer; the engine core owns one."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int]) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="llguidance-tokenizer")
        self._tokenizer: Future[llguidance.LLTokenizer] = self._pool.submit(
            _llg_tokenizer, tokenizer, vocab_size, list(eos_token_ids)
        )
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()
        self.vocab_size = vocab_size

    def matcher(self, spec: StructuredOutputs) -> llguidance.LLMatcher:
        """A matcher in its start state for ``spec``; InvalidParameter if llguidance rejects it."""
        text = grammar_text(spec)
        compiled = self._cache.get(text)
        if compiled is None:
            compiled = llguidance.LLMatcher(self._tokenizer.result(), text, log_level=0, limits=_limits())
            if compiled.is_error():
                raise InvalidParameter(
                    "structured_outputs", f"structured_outputs.{spec.kind} is invalid: {compiled.get_error().strip()}"
                )
            self._cache[text] = compiled
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(text)
        return compiled.deep_copy()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _llg_tokenizer(tokenizer: Any, vocab_size: int, eos_token_ids: list[int]) -> llguidance.LLTokenizer:
    import llguidance.hf

    return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=eos_token_ids or None)


class MaskWorker:
    """The token bitmasks of one step's sampling rows, computed in a worker thread. ``cores``: the
    engine's cores; the worker (and llguidance's own thread, started from it) may run on any of
    them, where a thread started by the pinned engine thread would share its one core."""

    def __init__(self, vocab_size: int, cores: Sequence[int] = ()) -> None:
        self.vocab_size = vocab_size
        self.words = (vocab_size + 31) // 32
        self._pool = ThreadPoolExecutor(
            1, thread_name_prefix="grammar-masks", initializer=_widen_affinity, initargs=(tuple(cores),)
        )
        self._executor: llguidance.LLExecutor | None = None  # made in the worker, with its affinity
        self._bitmask = np.empty((0, self.words), np.int32)

    def start(self, matchers: Sequence[llguidance.LLMatcher | None]) -> Future[np.ndarray] | None:
        """Start filling row i of a bitmask for each matcher i that is not None; None if none is."""
        rows = [(m, i) for i, m in enumerate(matchers) if m is not None]
        if not rows:
            return None
        if len(self._bitmask) < len(matchers):
            self._bitmask = np.empty((max(len(matchers), 2 * len(self._bitmask)), self.words), np.int32)
        bitmask = self._bitmask[: len(matchers)]
        return self._pool.submit(self._fill, rows, bitmask)

    def _fill(self, rows: list[tuple[llguidance.LLMatcher, int]], bitmask: np.ndarray) -> np.ndarray:
        if self._executor is None:
            self._executor = llguidance.LLExecutor(num_threads=1)
        fill_next_token_bitmask_par(self._executor, rows, bitmask)
        return bitmask

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _widen_affinity(cores: tuple[int, ...]) -> None:
    if cores:
        os.sched_setaffinity(0, cores)  # this thread only (Linux: 0 is the calling thread)


def allowed_tokens(bitmask_row: np.ndarray, vocab_size: int) -> np.ndarray:
    """A bitmask row (int32 words, bit i of word w = token 32w+i) as a bool array over the vocabulary."""
    bits = np.unpackbits(bitmask_row.view(np.uint8), bitorder="little")
    return bits[:vocab_size].view(bool)
