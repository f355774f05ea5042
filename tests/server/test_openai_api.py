"""The OpenAI API through the official ``openai`` client, against ``ortserve serve`` on the real
SmolLM2-135M-Instruct artifact."""

from __future__ import annotations

import httpx
import openai
import pytest
from conftest import API_KEY

from ortserve.tokenizer import load_tokenizer

pytestmark = pytest.mark.slow  # the real SmolLM2 server (session fixture)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
STORY = "Once upon a time, in a small village by the sea,"


@pytest.fixture(scope="module")
def api(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def model(api) -> str:
    return api.models.list().data[0].id


@pytest.fixture(scope="module")
def tokenizer(smollm2_artifact):
    return load_tokenizer(smollm2_artifact)


def test_models_lists_the_served_model(api):
    models = api.models.list().data
    assert [m.id for m in models] == ["smollm2-135m-instruct"]


def test_chat_answers_the_capital_of_france(api, model):
    reply = api.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=30)
    assert reply.choices[0].message.role == "assistant"
    assert "Paris" in reply.choices[0].message.content
    assert reply.choices[0].finish_reason == "stop"


def test_completion_continues_the_prompt(api, model):
    reply = api.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=8)
    assert "Paris" in reply.choices[0].text
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_completion_echo_puts_the_prompt_first(api, model):
    reply = api.completions.create(model=model, prompt=STORY, temperature=0, max_tokens=5, echo=True)
    assert reply.choices[0].text.startswith(STORY) and len(reply.choices[0].text) > len(STORY)


def test_completion_takes_a_batch_of_prompts_and_token_ids(api, model, tokenizer):
    texts = ["The capital of France is", "The capital of Italy is"]
    by_text = api.completions.create(model=model, prompt=texts, temperature=0, max_tokens=6)
    assert [c.index for c in by_text.choices] == [0, 1]
    assert "Paris" in by_text.choices[0].text and "Rome" in by_text.choices[1].text
    by_ids = api.completions.create(
        model=model, prompt=[tokenizer.encode(t) for t in texts], temperature=0, max_tokens=6
    )
    assert [c.text for c in by_ids.choices] == [c.text for c in by_text.choices]
    one = api.completions.create(model=model, prompt=tokenizer.encode(texts[0]), temperature=0, max_tokens=6)
    assert one.choices[0].text == by_text.choices[0].text


def test_streamed_chat_deltas_concatenate_to_the_greedy_text(api, model):
    whole = api.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=40)
    chunks = list(
        api.chat.completions.create(
            model=model,
            messages=QUESTION,
            temperature=0,
            max_tokens=40,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage


def test_streamed_completion_deltas_concatenate_to_the_greedy_text(api, model):
    whole = api.completions.create(model=model, prompt=STORY, temperature=0, max_tokens=48)
    chunks = list(api.completions.create(model=model, prompt=STORY, temperature=0, max_tokens=48, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason == "length"


def test_sse_stream_ends_with_done(server):
    with httpx.stream(
        "POST",
        f"{server.base_url}/v1/completions",
        timeout=60,
        headers={"Authorization": f"Bearer {API_KEY}"},
        json={"prompt": STORY, "max_tokens": 4, "stream": True},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]"


def test_n_2_gives_two_choices_with_their_own_usage(api, model):
    def ask():
        return api.chat.completions.create(
            model=model, messages=QUESTION, n=2, temperature=1.0, seed=7, max_tokens=16, logprobs=True
        )

    reply = ask()
    assert [c.index for c in reply.choices] == [0, 1]
    texts = [c.message.content for c in reply.choices]
    assert texts[0] != texts[1]  # two samples, not one answer twice
    assert texts == [c.message.content for c in ask().choices]  # seeded: the same pair again
    assert reply.usage.completion_tokens == sum(len(c.logprobs.content) for c in reply.choices)
    streamed = list(
        api.completions.create(model=model, prompt=STORY, n=2, temperature=1.0, seed=7, max_tokens=8, stream=True)
    )
    finished = {c.choices[0].index: c.choices[0].finish_reason for c in streamed if c.choices[0].finish_reason}
    assert finished == {0: "length", 1: "length"}


def test_chat_logprobs_hold_the_sampled_token_and_top_alternatives(api, model):
    reply = api.chat.completions.create(
        model=model, messages=QUESTION, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        assert entry.logprob <= 0
        # greedy: the sampled token is the most likely one
        assert entry.top_logprobs[0].token == entry.token
        assert entry.top_logprobs[0].logprob == pytest.approx(entry.logprob)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob


def test_completion_logprobs_line_up_with_the_text(api, model):
    reply = api.completions.create(model=model, prompt=STORY, temperature=0, max_tokens=10, logprobs=2)
    choice = reply.choices[0]
    lp = choice.logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 10
    assert "".join(lp.tokens) == choice.text
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(10)]
    assert all(lp.tokens[i] in lp.top_logprobs[i] for i in range(10))


def test_stop_string_ends_the_choice_before_it(api, model):
    full = api.completions.create(model=model, prompt=STORY, temperature=0, max_tokens=32).choices[0].text
    words = full.split()
    stop = " " + words[3]  # a word in the middle of the greedy text
    cut = full[: full.index(stop)]
    reply = api.completions.create(model=model, prompt=STORY, temperature=0, max_tokens=32, stop=[stop])
    assert reply.choices[0].text == cut
    assert reply.choices[0].finish_reason == "stop"
    streamed = api.completions.create(model=model, prompt=STORY, temperature=0, max_tokens=32, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == cut


def test_same_seed_same_sample(api, model):
    def sample(seed: int) -> str:
        return (
            api.completions.create(model=model, prompt=STORY, temperature=1.0, top_p=0.95, max_tokens=24, seed=seed)
            .choices[0]
            .text
        )

    assert sample(1234) == sample(1234)
    assert len({sample(seed) for seed in (1, 2, 3)}) > 1  # the seed is what makes them equal


def test_usage_equals_the_tokenizer_counts(api, model, tokenizer):
    reply = api.completions.create(model=model, prompt=STORY, temperature=0, max_tokens=12)
    assert reply.usage.prompt_tokens == len(tokenizer.encode(STORY))
    assert reply.usage.completion_tokens == 12 and reply.choices[0].finish_reason == "length"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 12

    chat = api.chat.completions.create(model=model, messages=QUESTION, temperature=0, max_tokens=30)
    prompt = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert chat.usage.prompt_tokens == len(tokenizer.encode(prompt, add_special_tokens=False))
    # the generated ids, re-encoded from the text, plus the EOS that ended it
    assert chat.usage.completion_tokens == len(tokenizer.encode(chat.choices[0].message.content)) + 1


def test_sampling_parameters_are_honoured(api, model, tokenizer):
    reply = api.chat.completions.create(
        model=model,
        messages=QUESTION,
        max_completion_tokens=8,
        temperature=0.7,
        top_p=0.9,
        presence_penalty=0.5,
        frequency_penalty=0.5,
        logit_bias={"28": -100},
        seed=3,
        user="test",
        stop=["\n\n"],
        extra_body={
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "min_tokens": 2,
            "ignore_eos": True,
            "stop_token_ids": [2],
        },
        logprobs=True,
    )
    choice = reply.choices[0]
    tokens = [entry.token for entry in choice.logprobs.content]
    assert 2 <= reply.usage.completion_tokens == len(tokens) <= 8  # min_tokens, max_completion_tokens
    assert choice.finish_reason == "length" or "\n\n" not in choice.message.content
    banned = tokenizer.decode([28])
    assert banned not in tokens  # logit_bias -100


def test_tokenize_and_detokenize_round_trip(server, tokenizer):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    tokens = httpx.post(f"{server.base_url}/tokenize", headers=headers, json={"prompt": STORY}).json()
    assert tokens["tokens"] == tokenizer.encode(STORY) and tokens["count"] == len(tokens["tokens"])
    text = httpx.post(f"{server.base_url}/detokenize", headers=headers, json={"tokens": tokens["tokens"]}).json()
    assert text["prompt"] == STORY
    chat = httpx.post(f"{server.base_url}/tokenize", headers=headers, json={"messages": QUESTION}).json()
    rendered = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)


def test_the_http_process_never_loads_torch(server):
    maps = open(f"/proc/{server.proc.pid}/maps").read()
    assert "libtorch" not in maps
