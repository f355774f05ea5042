"""Built-in chat templates for GGUF files that carry none (``tokenizer.chat_template`` absent).

llama.cpp falls back to ChatML for every such file; a Gemma or Phi-3 model does not know ChatML's
markers, so here the fallback is picked by architecture, among the templates whose special
tokens the vocabulary has, and the choice is logged. A family with no fitting template (GPT-2)
gets none: chat then answers 400 naming ``--chat-template``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChatTemplate:
    name: str
    source: str  # Jinja, rendered by transformers' apply_chat_template
    needs: tuple[str, ...] = ()  # tokens the vocabulary must have


# A system message goes first where the format has one, else before the first user turn.
_FOLD_SYSTEM = (
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set first = messages[0]['content'] ~ '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set first = '' %}{% set turns = messages %}{% endif %}"
)

TEMPLATES = {
    t.name: t
    for t in (
        ChatTemplate(
            "chatml",
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
            ("<|im_start|>", "<|im_end|>"),
        ),
        ChatTemplate(
            "gemma",
            "{{ bos_token }}" + _FOLD_SYSTEM + "{% for m in turns %}"
            "<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
            "{{ (first if loop.first else '') ~ m['content'] | trim }}<end_of_turn>\n{% endfor %}"
            "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}",
            ("<start_of_turn>", "<end_of_turn>"),
        ),
        ChatTemplate(
            "llama3",
            "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
            "{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
            "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}",
            ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        ),
        ChatTemplate(
            "phi3",
            "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>\n{% endif %}",
            ("<|user|>", "<|assistant|>", "<|end|>"),
        ),
        ChatTemplate(
            "mistral",
            "{{ bos_token }}" + _FOLD_SYSTEM + "{% for m in turns %}"
            "{% if m['role'] == 'user' %}[INST] {{ (first if loop.first else '') ~ m['content'] }} [/INST]"
            "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}",
        ),
    )
}

# GGUF general.architecture -> the templates to try, in order
BY_ARCHITECTURE: dict[str, tuple[str, ...]] = {
    "llama": ("llama3", "chatml", "mistral"),
    "qwen2": ("chatml",),
    "qwen3": ("chatml",),
    "phi3": ("phi3", "chatml"),
    "gemma": ("gemma",),
    "gemma2": ("gemma",),
    "gemma3": ("gemma",),
    "gpt2": (),
}


def builtin_template(gguf_arch: str, vocab: set[str]) -> ChatTemplate | None:
    """The first template for the architecture whose special tokens the vocabulary has."""
    for name in BY_ARCHITECTURE.get(gguf_arch, ("chatml",)):
        if all(token in vocab for token in TEMPLATES[name].needs):
            return TEMPLATES[name]
    return None
