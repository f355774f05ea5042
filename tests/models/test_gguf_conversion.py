"""The torch-free GGUF conversion gives what transformers' own GGUF loading gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from llama_gguf import llama_cpp_permute, write_llama_gguf
from ortserve.export.gguf_checkpoint import rotary_row_order
from ortserve.models import BUILTIN_MODELS, DEFAULT_MODEL, prepare_checkpoint

TEXTS = [
    "Hello, world!",
    "What is the capital of France?",
    "  leading spaces, trailing spaces  ",
    "Numbers: 3.14159, 2024-11-21, 1,000,000 and 0x1F.",
    "def f(x):\n\treturn x ** 2  # code\n",
    "Ünïcödé — café, naïve, 東京, Привет, 🙂🚀",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|> and <repo_name> are special",
    "",
]
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?"},
    ],
]


def gguf_file() -> Path:
    return BUILTIN_MODELS[DEFAULT_MODEL].gguf_path()


@pytest.fixture(scope="module")
def transformers_gguf_model():
    import torch
    from transformers import AutoModelForCausalLM

    path = gguf_file()
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def transformers_gguf_tokenizer():
    from transformers import AutoTokenizer

    path = gguf_file()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.fixture(scope="module")
def our_tokenizer(smollm2_checkpoint: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_checkpoint)


def test_rotary_row_order_inverts_llama_cpp_permute():
    rng = np.random.default_rng(0)
    for heads, head_size, cols in [(9, 64, 576), (3, 64, 576), (4, 16, 64), (1, 8, 3)]:
        weight = rng.standard_normal((heads * head_size, cols)).astype(np.float32)
        assert np.array_equal(llama_cpp_permute(weight, heads)[rotary_row_order(len(weight), heads)], weight)


@pytest.mark.slow
def test_weights_equal_transformers_gguf_loading(smollm2_checkpoint: Path, transformers_gguf_model):
    from safetensors.numpy import load_file

    ours = load_file(smollm2_checkpoint / "model.safetensors")
    reference = {name: t.detach().numpy() for name, t in transformers_gguf_model.state_dict().items()}
    # A tied LM head is the embedding; the checkpoint stores it once, as transformers' save does.
    assert transformers_gguf_model.config.tie_word_embeddings
    assert set(reference) == set(ours) | {"lm_head.weight"}
    for name, expected in reference.items():
        actual = ours["model.embed_tokens.weight" if name == "lm_head.weight" else name]
        assert actual.dtype == np.float32 and actual.shape == expected.shape, name
        assert np.array_equal(actual, expected), f"{name}: max diff {np.abs(actual - expected).max()}"
    print(f"\n{len(reference)} tensors bit-identical to transformers' GGUF loading")


@pytest.mark.slow
def test_config_equals_transformers_gguf_loading(smollm2_checkpoint: Path, transformers_gguf_model):
    from transformers import AutoConfig

    ignore = {"_name_or_path", "_model_name_or_path", "transformers_version", "name_or_path"}
    ours = {k: v for k, v in AutoConfig.from_pretrained(smollm2_checkpoint).to_dict().items() if k not in ignore}
    reference = {k: v for k, v in transformers_gguf_model.config.to_dict().items() if k not in ignore}
    reference.pop("quantization_config", None)
    # save_pretrained fills in `architectures`; the in-memory reference leaves it None.
    assert ours.pop("architectures") == ["LlamaForCausalLM"]
    reference.pop("architectures")
    assert ours == reference


@pytest.mark.slow
def test_tokenizer_ids_equal_transformers_gguf_tokenizer(our_tokenizer, transformers_gguf_tokenizer):
    for text in TEXTS:
        ids = our_tokenizer(text)["input_ids"]
        assert ids == transformers_gguf_tokenizer(text)["input_ids"], text
        assert our_tokenizer.decode(ids) == transformers_gguf_tokenizer.decode(ids)
    assert len(our_tokenizer) == len(transformers_gguf_tokenizer) == 49152


@pytest.mark.slow
def test_special_tokens_equal_transformers_gguf_tokenizer(our_tokenizer, transformers_gguf_tokenizer):
    for role in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(our_tokenizer, role) == getattr(transformers_gguf_tokenizer, role), role
    assert our_tokenizer.eos_token == "<|im_end|>"
    assert our_tokenizer.convert_tokens_to_ids("<|im_end|>") == 2


@pytest.mark.slow
def test_chat_template_equals_transformers_gguf_tokenizer(our_tokenizer, transformers_gguf_tokenizer):
    assert our_tokenizer.chat_template == transformers_gguf_tokenizer.chat_template
    for chat in CHATS:
        for kwargs in ({"tokenize": False}, {"tokenize": True}):
            ours = our_tokenizer.apply_chat_template(chat, add_generation_prompt=True, **kwargs)
            reference = transformers_gguf_tokenizer.apply_chat_template(chat, add_generation_prompt=True, **kwargs)
            assert ours == reference


@pytest.mark.slow
def test_generation_config_stops_at_im_end(smollm2_checkpoint: Path):
    generation = json.loads((smollm2_checkpoint / "generation_config.json").read_text())
    assert generation["eos_token_id"] in (2, [2])  # ChatML <|im_end|>
    assert generation["bos_token_id"] == 1 and generation["pad_token_id"] == 2


@pytest.mark.slow
def test_converted_checkpoint_answers_the_capital_of_france(smollm2_checkpoint: Path, our_tokenizer):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_checkpoint, dtype=torch.float32).eval()
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    ids = our_tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=16, do_sample=False)
    answer = our_tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer.strip() == "The capital of France is Paris."


@pytest.mark.slow
def test_user_gguf_file_round_trips_exactly(tmp_path: Path, tiny_llama_checkpoint: Path, monkeypatch):
    """A llama.cpp-layout GGUF of known fp32 weights converts back to exactly those weights."""
    from safetensors.numpy import load_file

    monkeypatch.setenv("ORTSERVE_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(tiny_llama_checkpoint, path, gguf_file())
    converted = prepare_checkpoint(path, progress=False)
    ours, original = load_file(converted / "model.safetensors"), load_file(tiny_llama_checkpoint / "model.safetensors")
    assert set(ours) == set(original)
    for name in original:
        assert np.array_equal(ours[name], original[name]), name
    config = json.loads((converted / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"]) == (2, 4, 2)
    assert config["head_dim"] == 32
    assert config["tie_word_embeddings"] is False
