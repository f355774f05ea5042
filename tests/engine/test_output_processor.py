"""Output processor: incremental detokenisation, stop strings, streaming hold-back, n samples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

from ortserve.engine.ipc import EngineCoreOutput, TokenLogprob
from ortserve.engine.output_processor import OutputProcessor
from ortserve.sampling_params import InvalidParameter, SamplingParams

EOS = 256


def byte_tokenizer() -> Tokenizer:
    """A real ``tokenizers`` byte-level tokenizer: token id = one UTF-8 byte; 256 is <eos>."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    chars = {b: chr(b) for b in bs}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    tokenizer = Tokenizer(models.BPE(vocab={c: b for b, c in chars.items()}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken("<eos>", special=True)])
    assert tokenizer.token_to_id("<eos>") == EOS
    return tokenizer


def ids_of(text: str) -> list[int]:
    return list(text.encode())


class Totals:
    """Deltas of one request added up per sample, as a consumer does."""

    def __init__(self) -> None:
        self.text: dict[int, str] = {}
        self.ids: dict[int, list[int]] = {}
        self.finish: dict[int, tuple] = {}

    def add(self, deltas) -> None:
        for delta in deltas:
            for d in delta.samples:
                self.text[d.index] = self.text.get(d.index, "") + d.text
                self.ids[d.index] = self.ids.get(d.index, []) + d.token_ids
                if d.finish_reason:
                    self.finish[d.index] = (d.finish_reason, d.stop_reason)


def stream(processor, request_id, token_ids, finish=None, stop_reason=None, index=0):
    """Feed tokens one per step; returns the RequestDeltas and abort lists."""
    results, aborts = [], []
    for k, token in enumerate(token_ids):
        last = k == len(token_ids) - 1
        out = EngineCoreOutput(
            request_id, index, [token], None, finish if last else None, stop_reason if last else None, 3, 0
        )
        outs, to_abort = processor.process_outputs([out])
        results += outs
        aborts += to_abort
    return results, aborts


def text_of(results, index=0) -> str:
    return "".join(d.text for r in results for d in r.samples if d.index == index)


def test_streamed_deltas_add_up_to_the_full_text_with_multibyte_characters():
    processor = OutputProcessor(byte_tokenizer())
    text = "héllo 🎉 wörld"
    processor.add_request("r", ids_of("ab:"), SamplingParams(max_tokens=100))
    results, _ = stream(processor, "r", ids_of(text), finish="length")
    deltas = [d.text for r in results for d in r.samples]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert results[-1].finished and [r.finished for r in results[:-1]] == [False] * (len(results) - 1)
    assert [t for r in results for d in r.samples for t in d.token_ids] == ids_of(text)
    assert not processor.has_unfinished_requests()


def test_stop_string_cuts_text_and_asks_for_abort():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("r", [65], SamplingParams(stop=["STOP"]))
    results, aborts = stream(processor, "r", ids_of("one two STOP three"))
    totals = Totals()
    totals.add(results)
    assert results[-1].finished and totals.text[0] == "one two "
    assert totals.finish[0] == ("stop", "STOP")
    assert aborts == ["r"]
    assert totals.ids[0] == ids_of("one two STOP")  # ids up to the stop string


def test_stop_string_kept_when_asked():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("r", [65], SamplingParams(stop=["END"], include_stop_str_in_output=True))
    results, _ = stream(processor, "r", ids_of("abcENDxyz"))
    assert text_of(results) == "abcEND"


def test_stop_string_spanning_many_deltas_is_found_and_never_sent():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("r", [65], SamplingParams(stop=["the end", "xyz"]))
    results, aborts = stream(processor, "r", ids_of("so this is the the end of it"))
    assert text_of(results) == "so this is the " and aborts == ["r"]


def test_streaming_holds_back_only_a_possible_stop_prefix():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("r", [65], SamplingParams(stop=["<end>"]))
    seen = []
    for ch in "ab<en":
        outs, _ = processor.process_outputs([EngineCoreOutput("r", 0, ids_of(ch))])
        seen.append(outs[0].samples[0].text)
    assert seen == ["a", "b", "", "", ""]
    outs, _ = processor.process_outputs([EngineCoreOutput("r", 0, ids_of("x"))])
    assert outs[0].samples[0].text == "<enx"  # no longer a prefix of the stop string


def test_held_back_text_is_released_when_the_request_ends_otherwise():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("r", [65], SamplingParams(stop=["<end>"]))
    results, _ = stream(processor, "r", ids_of("hi <e"), finish="length")
    assert text_of(results) == "hi <e"


def test_stop_token_text_is_left_out_unless_asked():
    for include, expected in ((False, "ok"), (True, "ok!")):
        processor = OutputProcessor(byte_tokenizer())
        processor.add_request("r", [65], SamplingParams(stop_token_ids=[33], include_stop_str_in_output=include))
        results, aborts = stream(processor, "r", ids_of("ok!"), finish="stop", stop_reason=33)
        assert text_of(results) == expected and aborts == []
        assert results[-1].samples[0].stop_reason == 33


def test_special_tokens_skipped_or_kept():
    for skip, expected in ((True, "hi"), (False, "hi<eos>")):
        processor = OutputProcessor(byte_tokenizer())
        processor.add_request("r", [65], SamplingParams(skip_special_tokens=skip, ignore_eos=True))
        results, _ = stream(processor, "r", ids_of("hi") + [EOS], finish="length")
        assert text_of(results) == expected


def test_n_samples_stream_separately_and_finish_together():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("r", [65], SamplingParams(n=2, stop=["."]))
    outs, aborts = processor.process_outputs(
        [EngineCoreOutput("r", 0, ids_of("a")), EngineCoreOutput("r", 1, ids_of("b"))]
    )
    assert [(c.index, c.text) for c in outs[0].samples] == [(0, "a"), (1, "b")]
    outs, aborts = processor.process_outputs([EngineCoreOutput("r", 1, ids_of("."))])
    assert aborts == [("r", 1)]
    assert [(c.index, c.finish_reason) for c in outs[0].samples] == [(1, "stop")]
    assert not outs[0].finished
    outs, _ = processor.process_outputs(
        [
            EngineCoreOutput("r", 1, ids_of("z")),  # after its stop: ignored
            EngineCoreOutput("r", 0, ids_of("c"), finish_reason="length"),
        ]
    )
    assert [(c.index, c.text) for c in outs[0].samples] == [(0, "c")]
    assert outs[0].finished and not processor.has_unfinished_requests()


def test_logprobs_come_one_per_new_token():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("r", [65], SamplingParams(logprobs=1))
    lp = TokenLogprob(-0.5, 1, [(104, -0.5)])
    first, _ = processor.process_outputs([EngineCoreOutput("r", 0, [104], [lp])])
    second, _ = processor.process_outputs([EngineCoreOutput("r", 0, [105], [lp], "length")])
    assert first[0].samples[0].logprobs == [lp] and second[0].samples[0].logprobs == [lp]
    assert second[0].samples[0].token_ids == [105]


def test_a_request_whose_processing_raises_fails_alone():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("bad", [65], SamplingParams())
    processor.add_request("good", [65], SamplingParams())
    processor.requests["bad"].samples[0].detokenizer = None  # any fault inside one request's update
    outs, aborts = processor.process_outputs([EngineCoreOutput("bad", 0, [66]), EngineCoreOutput("good", 0, [67])])
    by_id = {o.request_id: o for o in outs}
    assert by_id["bad"].finished and by_id["bad"].error and aborts == ["bad"]
    assert by_id["good"].samples[0].text == "C" and not by_id["good"].finished
    assert list(processor.requests) == ["good"]


def test_outputs_of_unknown_or_aborted_requests_are_ignored():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("r", [65], SamplingParams())
    processor.abort_requests(["r"])
    outs, aborts = processor.process_outputs([EngineCoreOutput("r", 0, [66]), EngineCoreOutput("x", 0, [66])])
    assert outs == [] and aborts == []


@pytest.mark.slow
def test_incremental_text_equals_full_decode_with_the_smollm2_tokenizer(smollm2_checkpoint):
    from ortserve.tokenizer import ChatPrompts, load_tokenizer

    tokenizer = load_tokenizer(smollm2_checkpoint)
    prompt = ChatPrompts(tokenizer).chat_token_ids([{"role": "user", "content": "Hi"}])
    text = "Sure!  Here's a café, 你好, and an emoji 🎉🎉 —\n\n  indented\tcode: x = [1, 2]."
    ids = tokenizer.encode(text, add_special_tokens=False)
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", list(prompt), SamplingParams())
    results, _ = stream(processor, "r", ids, finish="length")
    assert text_of(results) == tokenizer.decode(ids, skip_special_tokens=True)


# --- how often deltas go out: --stream-interval and final_only requests -------------------------


def run_steps(processor, steps, n=2):
    """Feed one request's steps: each step is a list of (sample index, token ids, finish reason);
    returns the deltas sent and the abort lists."""
    sent, aborts = [], []
    lp = TokenLogprob(-0.25, 1, [(97, -0.25)])
    for step in steps:
        outs = [
            EngineCoreOutput("r", index, ids, [lp] * len(ids), finish, num_prompt_tokens=2)
            for index, ids, finish in step
        ]
        deltas, to_abort = processor.process_outputs(outs)
        sent.append(deltas)
        aborts += to_abort
    return sent, aborts


def totals(sent):
    """Per sample: text, token ids, logprob count and finish reason, added up over every delta."""
    out: dict[int, list] = {}
    for deltas in sent:
        for delta in deltas:
            for d in delta.samples:
                t = out.setdefault(d.index, ["", [], 0, None, None])
                t[0] += d.text
                t[1] += d.token_ids
                t[2] += len(d.logprobs or ())
                t[3] = d.finish_reason or t[3]
                t[4] = d.stop_reason if d.finish_reason else t[4]
    return out


@st.composite
def request_steps(draw):
    """Steps of a 2-sample request: 1-3 tokens a sample a step (speculative steps carry several),
    text that may hold a stop string, every sample ending with 'length' unless a stop ends it."""
    lengths = [draw(st.integers(1, 12)) for _ in range(2)]
    texts = [draw(st.text(alphabet="ab.é🎉", min_size=n * 3, max_size=n * 3)) for n in lengths]
    pending = [ids_of(t) for t in texts]
    steps = []
    while any(pending):
        step = []
        for index, ids in enumerate(pending):
            if ids:
                k = draw(st.integers(1, 3))
                step.append((index, ids[:k], "length" if len(ids) <= k else None))
                pending[index] = ids[k:]
        steps.append(step)
    return steps


@settings(max_examples=150, deadline=None)
@given(request_steps(), st.integers(1, 6), st.sampled_from(["delta", "final_only"]), st.booleans())
def test_held_deltas_add_up_to_what_every_step_sends(steps, interval, kind, with_stop):
    stop = ["."] if with_stop else None

    def processor(every, output_kind):
        p = OutputProcessor(byte_tokenizer(), stream_interval=every)
        p.add_request("r", [65, 66], SamplingParams(n=2, stop=stop, logprobs=0, output_kind=output_kind))
        return p

    each_step, aborts_each = run_steps(processor(1, "delta"), steps)
    held, aborts_held = run_steps(processor(interval, kind), steps)
    assert totals(held) == totals(each_step) and aborts_held == aborts_each
    sent = [d for deltas in held for d in deltas]
    assert sent[-1].finished and sum(d.finished for d in sent) == 1
    assert held[0] and held[0][0].num_prompt_tokens == 2  # the first token goes out at once (TTFT)
    middle = sent[1:-1]
    if kind == "final_only":
        assert middle == []
    else:  # every delta between the first and the last holds at least `interval` tokens
        assert all(sum(len(s.token_ids) for s in d.samples) >= interval for d in middle)


def test_stream_interval_sends_every_k_tokens_and_the_end():
    processor = OutputProcessor(byte_tokenizer(), stream_interval=3)
    processor.add_request("r", [65], SamplingParams(max_tokens=8))
    results, _ = stream(processor, "r", ids_of("abcdefgh"), finish="length")
    assert [d.samples[0].text for d in results] == ["a", "bcd", "efg", "h"]
    assert [d.finished for d in results] == [False, False, False, True]


def test_a_non_streaming_request_sends_its_first_token_and_its_end():
    processor = OutputProcessor(byte_tokenizer())
    processor.add_request("r", [65], SamplingParams(max_tokens=8, output_kind="final_only"))
    results, _ = stream(processor, "r", ids_of("abcdefgh"), finish="length")
    assert [d.samples[0].text for d in results] == ["a", "bcdefgh"]


def test_held_text_goes_out_with_a_request_that_fails():
    processor = OutputProcessor(byte_tokenizer(), stream_interval=10)
    processor.add_request("r", [65], SamplingParams())
    results, _ = stream(processor, "r", ids_of("abc"))
    processor.requests["r"].samples[0].detokenizer = None  # a fault in the next step's update
    outs, aborts = processor.process_outputs([EngineCoreOutput("r", 0, [100])])
    assert [d.samples[0].text for d in results] == ["a"]
    assert outs[0].finished and outs[0].error and outs[0].samples[0].text == "bc" and aborts == ["r"]


def test_output_kind_is_checked():
    with pytest.raises(InvalidParameter) as exc:
        SamplingParams(output_kind="cumulative")
    assert exc.value.param == "output_kind"
