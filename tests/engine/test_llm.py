"""The offline API and the CLI on SmolLM2: LLM.generate / .chat, stop strings, n, the CLI, and
that the engine never needs torch and `import ortserve` stays light."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ortserve.sampling_params import SamplingParams

pytestmark = pytest.mark.slow
GREEDY = SamplingParams(temperature=0.0, max_tokens=24)


@pytest.fixture(scope="module")
def llm(smollm2_artifact):
    from ortserve import LLM

    before = os.sched_getaffinity(0)
    engine = LLM(str(smollm2_artifact), kv_cache_space=0.25, max_num_seqs=8)
    os.sched_setaffinity(0, before)  # the module shares this thread with other tests
    return engine


def test_chat_answers_the_capital_of_france(llm):
    [out] = llm.chat([{"role": "user", "content": "What is the capital of France?"}], GREEDY, use_tqdm=False)
    assert out.finished and out.outputs[0].text == "The capital of France is Paris."
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].token_ids[-1] == 2


def test_the_default_model_answers_the_capital_of_france_as_the_readme_says():
    """The embedded default (the wheel's Q4_1 codes, 16-bit activations), not an fp32 export."""
    from ortserve import LLM

    before = os.sched_getaffinity(0)
    default = LLM(kv_cache_space=0.25, max_num_seqs=2)
    os.sched_setaffinity(0, before)
    manifest = default.engine.core.manifest
    assert manifest.weight_precision == "int4" and manifest.activation_bits == 16
    question = [{"role": "user", "content": "What is the capital of France?"}]
    [out] = default.chat(question, GREEDY, use_tqdm=False)
    assert out.outputs[0].text == "The capital of France is Paris."


def test_generate_accepts_text_and_token_ids_and_keeps_order(llm):
    text = "The three primary colors are"
    ids = llm.get_tokenizer().encode(text)
    outs = llm.generate([text, ids, "Once upon a time"], GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in outs][:2] == [ids, ids]
    assert outs[0].outputs[0].token_ids == outs[1].outputs[0].token_ids
    assert outs[0].prompt == text and outs[1].prompt is None
    eos = llm.engine.core.eos_token_ids
    for c in (o.outputs[0] for o in outs):  # each ends by its budget, or by EOS within it
        assert (c.finish_reason, len(c.token_ids)) == ("length", 24) or (
            c.finish_reason == "stop" and c.token_ids[-1] in eos and len(c.token_ids) <= 24
        )
    assert "length" in {o.outputs[0].finish_reason for o in outs}


def test_generate_takes_vllms_prompt_dicts(llm):
    """vLLM's TextPrompt {"prompt": ...} and TokensPrompt {"prompt_token_ids": ...}, alone or in a
    list, are the same prompts as text and ids (they were iterated as a list of their keys)."""
    text = "The three primary colors are"
    ids = llm.get_tokenizer().encode(text)
    [plain] = llm.generate(text, GREEDY, use_tqdm=False)
    outs = llm.generate([{"prompt": text}, {"prompt_token_ids": ids}], GREEDY, use_tqdm=False)
    [single] = llm.generate({"prompt_token_ids": ids}, GREEDY, use_tqdm=False)
    assert [o.prompt_token_ids for o in (*outs, single)] == [ids, ids, ids]
    assert {tuple(o.outputs[0].token_ids) for o in (*outs, single)} == {tuple(plain.outputs[0].token_ids)}
    assert outs[0].prompt == text and outs[1].prompt is None
    for bad, says in (({"text": text}, "needs 'prompt' \\(text\\) or 'prompt_token_ids'"), ([[1, "a"]], "token ids")):
        with pytest.raises(ValueError, match=says):
            llm.generate(bad, GREEDY, use_tqdm=False)


def test_stop_string_is_cut_from_the_text(llm):
    [full] = llm.generate("Count: one, two, three,", GREEDY, use_tqdm=False)
    text = full.outputs[0].text
    stop = text.strip().split()[1] if len(text.split()) > 1 else text[:3]
    [cut] = llm.generate(
        "Count: one, two, three,", SamplingParams(temperature=0.0, max_tokens=24, stop=[stop]), use_tqdm=False
    )
    c = cut.outputs[0]
    assert (c.finish_reason, c.stop_reason) == ("stop", stop)
    assert c.text == text[: text.index(stop)] and stop not in c.text
    llm.engine.core.block_manager.check_idle()


def test_n_samples_with_a_seed_are_distinct_and_reproducible(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=12)
    first = llm.generate("Write a word:", params, use_tqdm=False)[0]
    again = llm.generate("Write a word:", params, use_tqdm=False)[0]
    assert [o.index for o in first.outputs] == [0, 1, 2]
    assert [o.token_ids for o in first.outputs] == [o.token_ids for o in again.outputs]
    assert len({tuple(o.token_ids) for o in first.outputs}) > 1


def test_logprobs_come_with_each_token(llm):
    [out] = llm.generate(
        "Paris is the capital of", SamplingParams(temperature=0.0, max_tokens=4, logprobs=2), use_tqdm=False
    )
    c = out.outputs[0]
    assert len(c.logprobs) == len(c.token_ids) == 4
    for token, lp in zip(c.token_ids, c.logprobs):
        assert lp.rank == 1 and lp.top_logprobs[0][0] == token and lp.logprob <= 0
        assert len(lp.top_logprobs) == 2


def test_a_rejected_prompt_leaves_the_engine_clean(llm):
    from ortserve.sampling_params import InvalidParameter

    with pytest.raises(InvalidParameter, match="maximum context length"):
        llm.generate(["fine", [5] * (llm.engine.core.max_model_len + 1)], GREEDY, use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()
    llm.engine.core.block_manager.check_idle()


def run_python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        cwd=Path(__file__).parent,
    )


def test_import_ortserve_is_light():
    result = run_python(
        "import sys, ortserve; heavy = [m for m in ('onnxruntime', 'transformers', 'torch', 'numpy') "
        "if m in sys.modules]; assert not heavy, heavy; ortserve.SamplingParams; print('ok')"
    )
    assert result.stdout.strip() == "ok", result.stderr


def test_the_engine_runs_without_torch(smollm2_artifact):
    result = run_python(
        "import sys; sys.modules['torch'] = None\n"
        "from ortserve import LLM, SamplingParams\n"
        f"llm = LLM({str(smollm2_artifact)!r}, kv_cache_space=0.1, threads_bind='nobind')\n"
        "out = llm.chat([{'role': 'user', 'content': 'What is the capital of France?'}],"
        " SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)\n"
        "print(out[0].outputs[0].text)\n"
        "assert not [m for m in sys.modules if m.startswith('torch.')]\n"
    )
    assert "Paris" in result.stdout, result.stderr


def test_generate_cli_streams_an_answer(smollm2_artifact):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ortserve.cli",
            "generate",
            "What is the capital of France?",
            "--model",
            str(smollm2_artifact),
            "--max-tokens",
            "16",
            "--kv-cache-space",
            "0.1",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "KV cache" in result.stderr and "maximum concurrency" in result.stderr  # the start-up block


def test_generate_cli_takes_the_model_as_its_first_word(smollm2_artifact, tmp_path):
    argv = [sys.executable, "-m", "ortserve.cli", "generate", str(smollm2_artifact), "What is the capital of France?"]
    result = subprocess.run([*argv, "--max-tokens", "16", "--kv-cache-space", "0.1"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout and str(smollm2_artifact) in result.stderr  # this artifact, not the default's


def test_generate_cli_says_when_the_model_has_no_chat_template(tiny_llama_artifact, tmp_path):
    import json
    import shutil

    bare = shutil.copytree(tiny_llama_artifact, tmp_path / "bare")
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((bare / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "ortserve.cli", "generate", str(bare), "hello", "--max-tokens", "2"]
    argv += ["--kv-cache-space", "0.05"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    assert "the model has no chat template: the prompt is completed as plain text" in result.stderr
    quiet = subprocess.run([*argv, "--no-chat"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and "no chat template" not in quiet.stderr


def test_a_first_word_that_names_no_model_is_the_prompt_s(tmp_path):
    from ortserve.generate_cli import split_model_argument

    assert split_model_argument(None, ["smollm2-135m-instruct", "hi"]) == ("smollm2-135m-instruct", ["hi"])
    assert split_model_argument(None, ["hello", "world"]) == (None, ["hello", "world"])
    assert split_model_argument(None, [str(tmp_path), "hi"]) == (None, [str(tmp_path), "hi"])  # a path, no model
    named = ["smollm2-135m-instruct", "hi"]
    assert split_model_argument("x.gguf", named) == ("x.gguf", named)  # --model given: every word is the prompt
    with pytest.raises(ValueError, match="'smollm2-135m-instruct' is a model: give the prompt after it"):
        split_model_argument(None, ["smollm2-135m-instruct"])  # a model and no prompt: not a one-word prompt


def test_generate_cli_reports_a_kv_budget_that_does_not_fit(smollm2_artifact):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ortserve.cli",
            "generate",
            "hi",
            "--model",
            str(smollm2_artifact),
            "--kv-cache-space",
            "100000",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 2 and "--kv-cache-space" in result.stderr and "Traceback" not in result.stderr


def test_threads_are_pinned_as_planned(smollm2_artifact):
    cores = sorted(os.sched_getaffinity(0))[:2]  # on a one-CPU machine the plan is that CPU alone
    result = run_python(
        "import os\n"
        "from ortserve.engine.config import EngineConfig\n"
        "from ortserve.engine.core import EngineCore\n"
        f"core = EngineCore(EngineConfig(model={str(smollm2_artifact)!r}, kv_cache_space=0.05,"
        f" threads_bind={','.join(map(str, cores))!r}))\n"
        "masks = [open(f'/proc/self/task/{t}/status').read().split('Cpus_allowed_list:')[1].split()[0]"
        " for t in os.listdir('/proc/self/task')]\n"
        "print(sorted(os.sched_getaffinity(0)), masks)\n"
    )
    assert result.returncode == 0, result.stderr
    assert f"[{cores[0]}]" in result.stdout  # the calling thread
    assert f"'{cores[-1]}'" in result.stdout  # ORT's pool thread (or the caller, with one CPU)


def test_generate_cli_renders_the_prompt_with_the_chat_template_flag(smollm2_artifact):
    from transformers import AutoTokenizer

    template = "<|im_start|>user\nAnswer in French. {{ messages[-1]['content'] }}<|im_end|>\n<|im_start|>assistant\n"
    question = [{"role": "user", "content": "What is the capital of France?"}]
    tokenizer = AutoTokenizer.from_pretrained(smollm2_artifact)
    expected = len(tokenizer.apply_chat_template(question, chat_template=template, tokenize=True, return_dict=False))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "ortserve.cli",
            "generate",
            "What is the capital of France?",
            "--model",
            str(smollm2_artifact),
            "--max-tokens",
            "1",
            "--kv-cache-space",
            "0.1",
            "--chat-template",
            template,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert f"[{expected} prompt tokens" in result.stderr
