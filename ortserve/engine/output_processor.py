"""Token ids -> text, on the API side of the process boundary (as vLLM v1's OutputProcessor).

The engine core has no tokenizer in the server case, so detokenisation and stop strings live
here. Each call to ``process_outputs`` turns the core's ``EngineCoreOutput``s into one
``RequestOutput`` per request that changed, and returns the samples that a stop string finished
so the caller aborts them in the core.

Incremental detokenisation (vLLM's ``detokenize_incrementally``): decode a sliding window of ids
twice, with and without the newest ones, and emit the difference. The window starts a few tokens
back so leading-space rules of the tokenizer apply as in a full decode, and a text ending in
U+FFFD (a multi-byte character split across tokens) is held until the next token completes it.

Stop strings: the text is cut at the first stop string (kept if ``include_stop_str_in_output``).
While streaming, the longest tail of the text that could still grow into a stop string is held
back, so a client never sees text that is later cut.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ortserve.engine.messages import EngineCoreOutput, FinishReason, TokenLogprob
from ortserve.sampling_params import SamplingParams

INITIAL_WINDOW = 5  # prompt tokens that seed the window, as vLLM


@dataclass
class CompletionOutput:
    index: int
    text: str = ""  # cumulative, stop string cut
    text_delta: str = ""  # new since the previous RequestOutput of this sample
    token_ids: list[int] = field(default_factory=list)  # cumulative
    token_ids_delta: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # cumulative, one per token id
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]  # the samples that changed in this step, by index
    finished: bool  # every sample of the request is finished
    prompt: str | None = None
    num_cached_tokens: int = 0


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Any, prompt_token_ids: list[int], skip_special_tokens: bool):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_token_ids[-INITIAL_WINDOW:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, token_ids: list[int]) -> str:
        """The text the new ids complete (possibly "")."""
        self.ids.extend(token_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return ""  # nothing printable yet, or a character still incomplete
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return new_text[len(prefix_text):]


class _Sample:
    def __init__(self, index: int, tokenizer: Any, prompt_token_ids: list[int], params: SamplingParams):
        self.out = CompletionOutput(index, logprobs=[] if params.logprobs is not None else None)
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids, params.skip_special_tokens)
        self.text = ""  # all decoded text, stop string cut
        self.sent = 0  # characters of text already handed out
        self.delta_ids: list[int] = []


class _RequestState:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                 prompt: str | None, tokenizer: Any):
        self.request_id = request_id
        self.prompt_token_ids = prompt_token_ids
        self.prompt = prompt
        self.params = params
        self.samples = [_Sample(i, tokenizer, prompt_token_ids, params) for i in range(params.n)]
        self.num_finished = 0
        self.num_cached_tokens = 0
        self.stop_holdback = max((len(s) for s in params.stop or ()), default=0)


class OutputProcessor:
    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.requests: dict[str, _RequestState] = {}

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    prompt: str | None = None) -> None:
        self.requests[request_id] = _RequestState(request_id, list(prompt_token_ids), params, prompt,
                                                  self.tokenizer)

    def abort_requests(self, request_ids) -> None:
        """Forget requests the caller gave up on (the core is told separately)."""
        for request_id in request_ids:
            self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def process_outputs(self, outputs: list[EngineCoreOutput]
                        ) -> tuple[list[RequestOutput], list[str | tuple[str, int]]]:
        """One RequestOutput per request that changed, and what to abort in the core: a request
        id, or (request id, sample index) when only one of n samples hit a stop string."""
        touched: dict[str, set[int]] = {}
        to_abort: list[str | tuple[str, int]] = []
        for output in outputs:
            state = self.requests.get(output.request_id)
            if state is None or not 0 <= output.index < len(state.samples):
                continue  # aborted here already, or finished by a stop string
            sample = state.samples[output.index]
            if sample.out.finished:
                continue
            state.num_cached_tokens = max(state.num_cached_tokens, output.num_cached_tokens)
            if self._update(state, sample, output):
                to_abort.append(state.request_id if len(state.samples) == 1 else (state.request_id, sample.out.index))
            touched.setdefault(state.request_id, set()).add(output.index)
            if sample.out.finished:
                state.num_finished += 1
        results = []
        for request_id, indices in touched.items():
            state = self.requests[request_id]
            finished = state.num_finished == len(state.samples)
            results.append(RequestOutput(
                request_id, state.prompt_token_ids, [self._snapshot(state, state.samples[i]) for i in sorted(indices)],
                finished, state.prompt, state.num_cached_tokens))
            if finished:
                del self.requests[request_id]
        return results, to_abort

    def _update(self, state: _RequestState, sample: _Sample, output: EngineCoreOutput) -> bool:
        """Apply one core output; True when a stop string finished the sample."""
        params = state.params
        out = sample.out
        ids = output.new_token_ids
        out.token_ids.extend(ids)
        sample.delta_ids.extend(ids)
        if out.logprobs is not None and output.new_logprobs:
            out.logprobs.extend(output.new_logprobs)
        text_ids = ids
        if (output.finish_reason == "stop" and not isinstance(output.stop_reason, str)
                and not params.include_stop_str_in_output and ids):
            text_ids = ids[:-1]  # the EOS or stop token: no text, as vLLM
        if text_ids:
            delta = sample.detokenizer.add(text_ids)
            sample.text += delta
            if params.stop and delta:
                hit = _find_stop(sample.text, len(delta), params.stop, params.include_stop_str_in_output)
                if hit is not None:
                    stop, end = hit
                    sample.text = sample.text[:end]
                    out.finish_reason, out.stop_reason = "stop", stop
                    return True
        if output.finish_reason is not None:
            out.finish_reason, out.stop_reason = output.finish_reason, output.stop_reason
        return False

    def _snapshot(self, state: _RequestState, sample: _Sample) -> CompletionOutput:
        """A fresh CompletionOutput: consumers may hold it while the next step runs."""
        out = sample.out
        visible = len(sample.text)
        if not out.finished and state.stop_holdback and not state.params.include_stop_str_in_output:
            visible -= _partial_stop_len(sample.text, state.params.stop)
        visible = max(visible, sample.sent)
        delta = sample.text[sample.sent:visible]
        sample.sent = visible
        delta_ids, sample.delta_ids = sample.delta_ids, []
        return CompletionOutput(
            out.index, sample.text[:visible], delta, list(out.token_ids), delta_ids,
            None if out.logprobs is None else list(out.logprobs), out.finish_reason, out.stop_reason)


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
    """Length of the longest tail of ``text`` that is a proper prefix of some stop string."""
    longest = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:k]):
                longest = k
                break
    return longest
