"""``--chat-template FILE|STRING`` replaces the model's template; a model without one answers chat
with a 400 that names the flag (the server around the fake engine: HTTP behaviour only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import openai
import pytest

TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}<|im_start|>assistant:"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def templateless(tokenizer_dir: Path, tmp_path_factory) -> Path:
    """The SmolLM2 tokenizer with its chat template removed."""
    folder = tmp_path_factory.mktemp("no-template")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def start(tokenizer: Path, *flags: str):
    from server_process import ServerProcess

    proc = ServerProcess.fake(tokenizer, *flags)
    proc.wait_ready(60)
    return proc, openai.OpenAI(base_url=f"{proc.base_url}/v1", api_key="none", max_retries=0)


def test_a_model_without_a_chat_template_answers_chat_with_a_400_naming_the_flag(templateless: Path):
    proc, api = start(templateless)
    try:
        with pytest.raises(openai.BadRequestError) as err:
            api.chat.completions.create(model="fake", messages=QUESTION, max_tokens=2)  # type: ignore[arg-type]
        assert "--chat-template" in err.value.body["message"] and err.value.body["param"] == "messages"
        assert api.completions.create(model="fake", prompt="Paris is", max_tokens=2).choices[0].text is not None
    finally:
        proc.stop(30)


@pytest.mark.parametrize("form", ["file", "string"])
def test_chat_template_flag_renders_chat_with_the_given_template(form: str, templateless: Path, tmp_path: Path):
    from transformers import AutoTokenizer

    value = TEMPLATE
    if form == "file":
        (tmp_path / "t.jinja").write_text(TEMPLATE)
        value = str(tmp_path / "t.jinja")
    rendered = AutoTokenizer.from_pretrained(templateless).apply_chat_template(
        QUESTION, chat_template=TEMPLATE, tokenize=True, add_generation_prompt=True, return_dict=False
    )
    proc, api = start(templateless, "--chat-template", value)
    try:
        reply = api.chat.completions.create(model="fake", messages=QUESTION, max_tokens=2)  # type: ignore[arg-type]
        assert reply.usage is not None and reply.usage.prompt_tokens == len(rendered)
    finally:
        proc.stop(30)


def test_a_chat_template_flag_that_is_neither_file_nor_jinja_stops_the_server_at_once(templateless: Path):
    from server_process import ServerProcess

    proc = ServerProcess.fake(templateless, "--chat-template", "no-such-file.jinja")
    assert proc.proc.wait(60) == 2
    assert "--chat-template 'no-such-file.jinja' is neither a file nor a Jinja template" in proc.output
