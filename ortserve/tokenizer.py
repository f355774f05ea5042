"""The artifact's tokenizer and chat template: loaded here and nowhere else.

The server (HTTP process: prompts; engine process: detokenisation), the offline ``LLM``, the
``generate`` CLI and the benchmarks all call ``load_tokenizer``. ``ChatPrompts`` renders
conversations through the chat template (the artifact's, or a ``--chat-template`` override) and
refuses message content that spells a special token, so a user cannot forge a turn of another
role, unless that was explicitly allowed.

Tools: a template that reads the ``tools`` variable gets the tools and the history's
``tool_calls`` / ``tool`` messages as transformers passes them. A template that does not (the
built-in SmolLM2's ChatML) gets them the Hermes way (``inject_tools``): a system message lists
them inside ``<tools></tools>`` and asks for ``<tool_call>{"name", "arguments"}</tool_call>``;
past calls become that text in the assistant's turn, and tool results a user turn of
``<tool_response>...</tool_response>`` (as Qwen 2.5's template writes them).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ortserve.sampling_params import InvalidParameter

Message = dict[str, Any]


def block_torch_import() -> None:
    """Make ``import torch`` fail in this process (transformers then loads tokenizers only).
    Serving must not pay torch's import time and memory; call before transformers is imported."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]  # the import system's "not found"
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" banner


def read_chat_template(value: str) -> str:
    """``--chat-template``: a file's path, or the template text itself."""
    path = Path(value).expanduser()
    if len(value) < 4096 and "{" not in value and path.is_file():
        return path.read_text(encoding="utf-8")
    if "{" not in value:
        raise ValueError(f"--chat-template {value!r} is neither a file nor a Jinja template")
    return value


def load_tokenizer(artifact_dir: str | Path, chat_template: str | None = None) -> Any:
    """The artifact's Hugging Face tokenizer (offline: no hub), with ``chat_template`` (a path
    or template text) replacing the artifact's own when given."""
    from transformers import AutoTokenizer

    from ortserve.artifact import TOKENIZER_SETTINGS, has_tokenizer

    folder = Path(artifact_dir)
    if not has_tokenizer(folder):
        raise ValueError(
            f"{folder} has no tokenizer ({' or '.join(TOKENIZER_SETTINGS)}): copy the checkpoint's tokenizer files "
            "into it (or export from a checkpoint directory that holds them)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{folder}: its tokenizer could not be loaded: {exc}") from exc
    if chat_template is not None:
        tokenizer.chat_template = read_chat_template(chat_template)
    return tokenizer


TOOLS_PROMPT = (
    "You can call functions to answer. They are described in JSON Schema inside <tools></tools>:\n"
    "<tools>\n{tools}\n</tools>\n\n"
    "To call a function, answer with one JSON object per call, holding the function's name and "
    "its arguments, each inside <tool_call></tool_call> tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <arguments-object>}}\n</tool_call>'
)


def renders_tools(template: str | None) -> bool:
    """Whether a chat template reads the ``tools`` variable (and so renders tools itself)."""
    return bool(template) and re.search(r"\btools\b", template or "") is not None


def inject_tools(conversation: list[Message], tools: list[dict[str, Any]] | None) -> list[Message]:
    """The Hermes rendering for a template that knows no tools: a system message lists them,
    past calls become <tool_call> text, tool results a user turn of <tool_response>s."""
    out: list[Message] = []
    responses = False  # out[-1] is a turn of tool results
    for entry in conversation:
        if entry["role"] == "tool":
            response = f"<tool_response>\n{entry.get('content') or ''}\n</tool_response>"
            if responses:  # consecutive results share one turn
                out[-1]["content"] += "\n" + response
            else:
                out.append({"role": "user", "content": response})
            responses = True
            continue
        responses = False
        entry = dict(entry)
        calls = entry.pop("tool_calls", None)
        if calls:
            texts = [_tool_call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls]
            entry["content"] = "\n".join(filter(None, [entry.get("content") or "", *texts]))
        out.append(entry)
    if tools:
        listing = TOOLS_PROMPT.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if out and out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{listing}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": listing})
    return out


def _tool_call_text(name: str, arguments: Any) -> str:
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{call}\n</tool_call>"


def _uses_tools(conversation: list[Message]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in conversation)


@dataclass
class ChatPrompts:
    """Text and conversations -> token ids, and token ids -> text, for one tokenizer."""

    tokenizer: Any
    allow_special_tokens_in_content: bool = False

    def __post_init__(self) -> None:
        special = getattr(self.tokenizer, "all_special_tokens", None) or []
        added = getattr(self.tokenizer, "added_tokens_decoder", None) or {}
        self.special_tokens = sorted({*special, *(t.content for t in added.values() if t.special)}, key=len)
        self.token_text = lru_cache(maxsize=65536)(self._token_text)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def special_token_id(self, text: str) -> int | None:
        """The id of ``text`` when it is one special (added) token, else None."""
        if text not in self.special_tokens:
            return None
        token_id = self.tokenizer.convert_tokens_to_ids(text)
        return token_id if isinstance(token_id, int) else None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return str(self.tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens))

    def _token_text(self, token_id: int) -> str:
        """One token as text, for logprobs (a lone byte of a multi-byte character stays as the
        replacement character, as vLLM and OpenAI do)."""
        return str(self.tokenizer.decode([token_id]))

    def check_content(self, conversation: list[Message]) -> None:
        if self.allow_special_tokens_in_content:
            return
        for i, message in enumerate(conversation):
            content = message.get("content")
            if not isinstance(content, str):
                continue
            found = next((t for t in self.special_tokens if t and t in content), None)
            if found is not None:
                raise InvalidParameter(
                    "messages",
                    f"messages[{i}].content contains the special token {found!r}, which "
                    f"could forge a turn; remove it (or start the server with "
                    f"--allow-special-tokens-in-content)",
                )

    def render_chat(
        self,
        conversation: list[Message],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> str:
        """The conversation through the chat template, as text (its special tokens included);
        ``tools`` as OpenAI's (``{"type": "function", "function": {...}}``)."""
        if not self.has_chat_template and chat_template is None:
            raise InvalidParameter(
                "messages",
                "this model has no chat template: start the server with --chat-template FILE, or use /v1/completions",
            )
        if continue_final_message and conversation[-1].get("content") is None:  # continued from its start
            conversation = [*conversation[:-1], {**conversation[-1], "content": ""}]
        kwargs = dict(template_kwargs or {})
        if tools or _uses_tools(conversation):
            if renders_tools(chat_template or self.tokenizer.chat_template):
                kwargs["tools"] = tools
            else:
                conversation = inject_tools(conversation, tools)
        self.check_content(conversation)
        try:
            text = self.tokenizer.apply_chat_template(
                conversation,
                tokenize=False,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                chat_template=chat_template,
                **kwargs,
            )
        except Exception as exc:  # jinja raises on conversations the template refuses
            raise InvalidParameter("messages", f"the chat template refused messages: {exc}") from exc
        return str(text)

    def chat_token_ids(
        self,
        conversation: list[Message],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        template_kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        text = self.render_chat(
            conversation, add_generation_prompt, continue_final_message, template_kwargs, tools=tools
        )
        return self.encode(text, add_special_tokens=False)  # the template wrote BOS and role markers
