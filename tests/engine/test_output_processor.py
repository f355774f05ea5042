"""Output processor: incremental detokenisation, stop strings, streaming hold-back, n samples."""
from __future__ import annotations

import pytest

from ortserve.engine.messages import EngineCoreOutput, TokenLogprob
from ortserve.engine.output_processor import OutputProcessor
from ortserve.sampling_params import SamplingParams

EOS = 256


class ByteTokenizer:
    """Token id = one UTF-8 byte; 256 is a special end-of-sequence token."""

    def decode(self, ids, skip_special_tokens=True):
        data = bytes(i for i in ids if i < 256)
        text = data.decode("utf-8", errors="replace")
        if not skip_special_tokens:
            text += "<eos>" * sum(1 for i in ids if i == EOS)
        return text


def ids_of(text: str) -> list[int]:
    return list(text.encode())


def stream(processor, request_id, token_ids, finish=None, stop_reason=None, index=0):
    """Feed tokens one per step; returns the RequestOutputs and abort lists."""
    results, aborts = [], []
    for k, token in enumerate(token_ids):
        last = k == len(token_ids) - 1
        out = EngineCoreOutput(request_id, index, [token], None, finish if last else None,
                               stop_reason if last else None, 3, 0)
        outs, to_abort = processor.process_outputs([out])
        results += outs
        aborts += to_abort
    return results, aborts


def test_streamed_deltas_add_up_to_the_full_text_with_multibyte_characters():
    processor = OutputProcessor(ByteTokenizer())
    text = "héllo 🎉 wörld"
    processor.add_request("r", ids_of("ab:"), SamplingParams(max_tokens=100))
    results, _ = stream(processor, "r", ids_of(text), finish="length")
    deltas = [o.outputs[0].text_delta for o in results]
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)
    assert results[-1].finished and results[-1].outputs[0].text == text
    assert results[-1].outputs[0].token_ids == ids_of(text)
    assert not processor.has_unfinished_requests()


def test_stop_string_cuts_text_and_asks_for_abort():
    processor = OutputProcessor(ByteTokenizer())
    processor.add_request("r", [65], SamplingParams(stop=["STOP"]))
    results, aborts = stream(processor, "r", ids_of("one two STOP three"))
    final = results[-1]
    assert final.finished and final.outputs[0].text == "one two "
    assert (final.outputs[0].finish_reason, final.outputs[0].stop_reason) == ("stop", "STOP")
    assert aborts == ["r"]
    assert "".join(o.outputs[0].text_delta for o in results) == "one two "
    assert len(final.outputs[0].token_ids) == len("one two STOP")  # ids up to the stop string


def test_stop_string_kept_when_asked():
    processor = OutputProcessor(ByteTokenizer())
    processor.add_request("r", [65], SamplingParams(stop=["END"], include_stop_str_in_output=True))
    results, _ = stream(processor, "r", ids_of("abcENDxyz"))
    assert results[-1].outputs[0].text == "abcEND"


def test_streaming_holds_back_only_a_possible_stop_prefix():
    processor = OutputProcessor(ByteTokenizer())
    processor.add_request("r", [65], SamplingParams(stop=["<end>"]))
    seen = []
    for ch in "ab<en":
        outs, _ = processor.process_outputs([EngineCoreOutput("r", 0, ids_of(ch))])
        seen.append(outs[0].outputs[0].text)
    assert seen == ["a", "ab", "ab", "ab", "ab"]
    outs, _ = processor.process_outputs([EngineCoreOutput("r", 0, ids_of("x"))])
    assert outs[0].outputs[0].text == "ab<enx"  # no longer a prefix of the stop string
    assert outs[0].outputs[0].text_delta == "<enx"


def test_held_back_text_is_released_when_the_request_ends_otherwise():
    processor = OutputProcessor(ByteTokenizer())
    processor.add_request("r", [65], SamplingParams(stop=["<end>"]))
    results, _ = stream(processor, "r", ids_of("hi <e"), finish="length")
    assert results[-1].outputs[0].text == "hi <e"
    assert "".join(o.outputs[0].text_delta for o in results) == "hi <e"


def test_stop_token_text_is_left_out_unless_asked():
    for include, expected in ((False, "ok"), (True, "ok!")):
        processor = OutputProcessor(ByteTokenizer())
        processor.add_request("r", [65], SamplingParams(stop_token_ids=[33], include_stop_str_in_output=include))
        results, aborts = stream(processor, "r", ids_of("ok!"), finish="stop", stop_reason=33)
        assert results[-1].outputs[0].text == expected and aborts == []
        assert results[-1].outputs[0].stop_reason == 33


def test_special_tokens_skipped_or_kept():
    for skip, expected in ((True, "hi"), (False, "hi<eos>")):
        processor = OutputProcessor(ByteTokenizer())
        processor.add_request("r", [65], SamplingParams(skip_special_tokens=skip, ignore_eos=True))
        results, _ = stream(processor, "r", ids_of("hi") + [EOS], finish="length")
        assert results[-1].outputs[0].text == expected


def test_n_samples_stream_separately_and_finish_together():
    processor = OutputProcessor(ByteTokenizer())
    processor.add_request("r", [65], SamplingParams(n=2, stop=["."]))
    outs, aborts = processor.process_outputs([EngineCoreOutput("r", 0, ids_of("a")),
                                              EngineCoreOutput("r", 1, ids_of("b"))])
    assert [(c.index, c.text) for c in outs[0].outputs] == [(0, "a"), (1, "b")]
    outs, aborts = processor.process_outputs([EngineCoreOutput("r", 1, ids_of("."))])
    assert aborts == [("r", 1)]
    assert [(c.index, c.finish_reason) for c in outs[0].outputs] == [(1, "stop")]
    assert not outs[0].finished
    outs, _ = processor.process_outputs([EngineCoreOutput("r", 1, ids_of("z")),  # after its stop: ignored
                                         EngineCoreOutput("r", 0, ids_of("c"), finish_reason="length")])
    assert [(c.index, c.text) for c in outs[0].outputs] == [(0, "ac")]
    assert outs[0].finished and not processor.has_unfinished_requests()


def test_logprobs_accumulate_one_per_token():
    processor = OutputProcessor(ByteTokenizer())
    processor.add_request("r", [65], SamplingParams(logprobs=1))
    lp = TokenLogprob(-0.5, 1, [(104, -0.5)])
    outs, _ = processor.process_outputs([EngineCoreOutput("r", 0, [104], [lp])])
    outs, _ = processor.process_outputs([EngineCoreOutput("r", 0, [105], [lp], "length")])
    assert outs[0].outputs[0].logprobs == [lp, lp]
    assert outs[0].outputs[0].token_ids_delta == [105]


def test_snapshots_do_not_change_after_the_next_step():
    processor = OutputProcessor(ByteTokenizer())
    processor.add_request("r", [65], SamplingParams())
    first, _ = processor.process_outputs([EngineCoreOutput("r", 0, ids_of("a"))])
    processor.process_outputs([EngineCoreOutput("r", 0, ids_of("b"))])
    assert (first[0].outputs[0].text, first[0].outputs[0].token_ids) == ("a", ids_of("a"))


def test_outputs_of_unknown_or_aborted_requests_are_ignored():
    processor = OutputProcessor(ByteTokenizer())
    processor.add_request("r", [65], SamplingParams())
    processor.abort_requests(["r"])
    outs, aborts = processor.process_outputs([EngineCoreOutput("r", 0, [66]), EngineCoreOutput("x", 0, [66])])
    assert outs == [] and aborts == []


@pytest.mark.slow
def test_incremental_text_equals_full_decode_with_the_smollm2_tokenizer(smollm2_checkpoint):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=True,
                                           add_generation_prompt=True)
    if isinstance(prompt, dict) or hasattr(prompt, "input_ids"):
        prompt = prompt["input_ids"]
    text = "Sure!  Here's a café, 你好, and an emoji 🎉🎉 —\n\n  indented\tcode: x = [1, 2]."
    ids = tokenizer.encode(text, add_special_tokens=False)
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", list(prompt), SamplingParams())
    results, _ = stream(processor, "r", ids, finish="length")
    assert "".join(o.outputs[0].text_delta for o in results) == tokenizer.decode(ids, skip_special_tokens=True)
