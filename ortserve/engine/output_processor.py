"""Token ids -> text deltas: incremental detokenisation and stop strings (vLLM's OutputProcessor).

``process_outputs`` turns one core step's ``EngineCoreOutput``s into one ``RequestDelta`` per
request that changed, and returns the samples a stop string finished, so the caller aborts them
in the core. Deltas carry only what is new: the work per step does not grow with the length of
the generation, and a consumer that wants the whole text adds the deltas up.

Detokenisation is ``tokenizers``' ``DecodeStream``, seeded with the prompt's last tokens so the
tokenizer's leading-space rules apply as in a full decode; it holds back a multi-byte character
split across tokens until it is complete.

Stop strings: the text is cut at the first stop string (kept if ``include_stop_str_in_output``).
The longest tail that could still grow into a stop string is held back, so a client never sees
text that is later cut. Only a window of the last characters is searched, never the whole text.

How often a request's changes go out (``HeldDelta``): a request's first token at once (its time to
first token), then every ``stream_interval`` tokens (``--stream-interval``, vLLM's: fewer, larger
deltas cost the server and its clients less per token), and its end. A ``final_only`` request (a
non-streaming HTTP request) sends only its first token and its end. Held changes merge: the deltas
sent add up to the same text, token ids and logprobs whatever the interval.
"""

from __future__ import annotations

import logging
from typing import Any

from tokenizers.decoders import DecodeStream

from ortserve.engine.ipc import EngineCoreOutput, RequestDelta, SampleDelta
from ortserve.sampling_params import SamplingParams

INITIAL_WINDOW = 5  # prompt tokens that seed the decoder, as vLLM

logger = logging.getLogger("ortserve.engine")


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool):
        self._backend = getattr(tokenizer, "backend_tokenizer", tokenizer)  # a tokenizers.Tokenizer
        self._stream = DecodeStream(
            ids=list(prompt_token_ids[-INITIAL_WINDOW:]), skip_special_tokens=skip_special_tokens
        )

    def add(self, token_ids: list[int]) -> str:
        """The text the new ids complete (possibly "")."""
        pieces = [self._stream.step(self._backend, t) for t in token_ids]
        return "".join(p for p in pieces if p)


class _Sample:
    def __init__(self, index: int, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams):
        self.index = index
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens)
        self.window = ""  # sent text's last characters (for stops that span deltas) + held text
        self.held = 0  # characters at the end of window not sent yet
        self.finished = False


class HeldDelta:
    """A request's changes not sent yet. ``every``: send once this many tokens are held (None:
    only at the end); the first change and the last are sent at once."""

    def __init__(self, every: int | None):
        self.every = every
        self.delta: RequestDelta | None = None
        self.num_tokens = 0
        self.sent_any = False

    def add(self, delta: RequestDelta) -> RequestDelta | None:
        """Hold ``delta``; what to send now (everything held), or None."""
        self.num_tokens += max((len(s.token_ids) for s in delta.samples), default=0)
        self.delta = delta if self.delta is None else _merge(self.delta, delta)
        due = delta.finished or not self.sent_any or (self.every is not None and self.num_tokens >= self.every)
        if not due:
            return None
        out, self.delta, self.num_tokens, self.sent_any = self.delta, None, 0, True
        return out


def _merge(held: RequestDelta, new: RequestDelta) -> RequestDelta:
    """``held`` followed by ``new``, as one delta (``held`` is updated and returned)."""
    samples = {s.index: s for s in held.samples}
    for sample in new.samples:
        old = samples.get(sample.index)
        if old is None:
            held.samples.append(sample)
            continue
        old.text += sample.text
        old.token_ids += sample.token_ids  # in place: a held request's lists grow without copies
        if old.logprobs is None:
            old.logprobs = sample.logprobs
        elif sample.logprobs:
            old.logprobs += sample.logprobs
        old.finish_reason, old.stop_reason = sample.finish_reason, sample.stop_reason
    held.finished, held.error = new.finished, new.error
    held.num_cached_tokens = new.num_cached_tokens
    if held.prompt_logprobs is None:
        held.prompt_logprobs = new.prompt_logprobs
    return held


class _RequestState:
    def __init__(self, prompt_token_ids: list[int], params: SamplingParams, tokenizer: Any, stream_interval: int):
        self.params = params
        self.samples = [_Sample(i, tokenizer, prompt_token_ids, params) for i in range(params.n)]
        self.num_finished = 0
        self.num_cached_tokens = 0
        self.longest_stop = max((len(s) for s in params.stop or ()), default=0)
        self.held = HeldDelta(None if params.output_kind == "final_only" else stream_interval)


class OutputProcessor:
    def __init__(self, tokenizer: Any, stream_interval: int = 1):
        self.tokenizer = tokenizer
        self.stream_interval = stream_interval
        self.requests: dict[str, _RequestState] = {}

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.requests[request_id] = _RequestState(list(prompt_token_ids), params, self.tokenizer, self.stream_interval)

    def abort_requests(self, request_ids: list[str]) -> None:
        """Forget requests the caller gave up on (the core is told separately)."""
        for request_id in request_ids:
            self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def process_outputs(
        self, outputs: list[EngineCoreOutput]
    ) -> tuple[list[RequestDelta], list[str | tuple[str, int]]]:
        """One RequestDelta per request with changes due to be sent (see ``HeldDelta``), and what
        to abort in the core: a request id, or (request id, sample index) when only one of n
        samples hit a stop string. A request whose processing raises ends alone, with ``error``
        set; the others go on."""
        deltas: dict[str, RequestDelta] = {}
        states: dict[str, _RequestState] = {}
        to_abort: list[str | tuple[str, int]] = []
        for output in outputs:
            request_id = output.request_id
            state = self.requests.get(request_id)
            if state is None or not 0 <= output.index < len(state.samples):
                continue  # aborted here already, or finished by a stop string
            sample = state.samples[output.index]
            if sample.finished:
                continue
            delta = deltas.get(request_id)
            if delta is None:
                delta = deltas[request_id] = RequestDelta(request_id, [], num_prompt_tokens=output.num_prompt_tokens)
                states[request_id] = state
            try:
                sample_delta, stopped = self._update(state, sample, output)
            except Exception:
                logger.exception("processing the output of request %s failed", request_id)
                del self.requests[request_id]
                delta.finished, delta.error = True, "internal error while processing this request's output"
                to_abort.append(request_id)
                continue
            delta.samples.append(sample_delta)
            if output.prompt_logprobs is not None:
                delta.prompt_logprobs = output.prompt_logprobs
            state.num_cached_tokens = max(state.num_cached_tokens, output.num_cached_tokens)
            if stopped:
                to_abort.append(request_id if len(state.samples) == 1 else (request_id, sample.index))
            if sample.finished:
                state.num_finished += 1
            if state.num_finished == len(state.samples):
                delta.finished = True
                del self.requests[request_id]
            delta.num_cached_tokens = state.num_cached_tokens
        due = (states[request_id].held.add(delta) for request_id, delta in deltas.items())
        return [delta for delta in due if delta is not None], to_abort

    def _update(self, state: _RequestState, sample: _Sample, output: EngineCoreOutput) -> tuple[SampleDelta, bool]:
        """Apply one core output; the sample's delta, and True when a stop string finished it."""
        params = state.params
        ids = output.new_token_ids
        delta = SampleDelta(
            sample.index,
            token_ids=list(ids),
            logprobs=list(output.new_logprobs or ()) if params.logprobs is not None else None,
        )
        text_ids = ids
        if (
            output.finish_reason == "stop"
            and not isinstance(output.stop_reason, str)
            and not output.finished_by_grammar
            and not params.include_stop_str_in_output
            and ids
        ):
            text_ids = ids[:-1]  # the EOS or stop token: no text, as vLLM
        new_text = sample.detokenizer.add(text_ids) if text_ids else ""
        finishing = output.finish_reason is not None
        if not params.stop:
            delta.text = new_text
        else:
            sent = len(sample.window) - sample.held
            sample.window += new_text
            hit = _find_stop(sample.window, len(new_text) + sample.held, params.stop, params.include_stop_str_in_output)
            if hit is not None:
                stop, cut = hit
                delta.text = sample.window[sent : max(cut, sent)]
                delta.finish_reason, delta.stop_reason = "stop", stop
                sample.finished = True
                return delta, True
            keep = (
                0 if finishing or params.include_stop_str_in_output else _partial_stop_len(sample.window, params.stop)
            )
            end = max(len(sample.window) - keep, sent)
            delta.text = sample.window[sent:end]
            sample.held = len(sample.window) - end
            sample.window = sample.window[max(0, end - state.longest_stop) :]  # bounded: stops + held
        if finishing:
            delta.finish_reason, delta.stop_reason = output.finish_reason, output.stop_reason
            sample.finished = True
        return delta, False


def _find_stop(text: str, num_new: int, stops: list[str], include: bool) -> tuple[str, int] | None:
    """The earliest stop string that ends in the newest ``num_new`` characters: (stop, cut)."""
    best = None
    for stop in stops:
        i = text.find(stop, max(0, len(text) - num_new - len(stop) + 1))
        if i != -1 and (best is None or i < best[1]):
            best = (stop, i)
    if best is None:
        return None
    stop, i = best
    return stop, i + len(stop) if include else i


def _partial_stop_len(text: str, stops: list[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of some stop string (only
    tails that start with the stop's first character are compared)."""
    longest = 0
    for stop in stops:
        i = text.find(stop[0], max(0, len(text) - len(stop) + 1))
        while i != -1 and len(text) - i > longest:
            if stop.startswith(text[i:]):
                longest = len(text) - i
                break
            i = text.find(stop[0], i + 1)
    return longest
