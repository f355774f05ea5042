"""The offline API: ``LLM(model).generate(prompts, SamplingParams)`` and ``.chat(messages)``.

The engine runs in the caller's process and thread (pinned to the engine's first core unless
``threads_bind="nobind"``), driven by the same ``LLMEngine`` loop as the server's engine process.
Results have vLLM's shape: ``outputs[i].outputs[j].text``.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from ortserve.engine.ipc import FinishReason, RequestDelta, TokenLogprob
from ortserve.sampling_params import SamplingParams, model_sampling_defaults
from ortserve.tokenizer import ChatPrompts, Message

# vLLM's prompt forms: text, token ids, {"prompt": text} (TextPrompt), {"prompt_token_ids": ids} (TokensPrompt)
Prompt = str | list[int] | dict[str, Any]


@dataclass
class CompletionOutput:
    """One finished sample."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: FinishReason | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """One prompt's samples."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    finished: bool = False
    # with SamplingParams.prompt_logprobs: None for the first prompt token, then one per token
    prompt_logprobs: list[TokenLogprob | None] | None = None

    def add(self, delta: RequestDelta) -> None:
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = [None, *delta.prompt_logprobs]
        for d in delta.samples:
            out = self.outputs[d.index]
            out.text += d.text
            out.token_ids += d.token_ids
            if d.logprobs is not None:
                out.logprobs = (out.logprobs or []) + d.logprobs
            if d.finish_reason is not None:
                out.finish_reason, out.stop_reason = d.finish_reason, d.stop_reason
        self.num_cached_tokens = max(self.num_cached_tokens, delta.num_cached_tokens)
        if delta.error is not None:
            raise RuntimeError(f"request {self.request_id} failed: {delta.error}")
        self.finished = delta.finished


class LLM:
    """``model``: an artifact directory, a Hugging Face checkpoint directory, a .gguf file or a
    built-in model name (default: the embedded SmolLM2; anything but an artifact is exported on
    first use and cached).
    Other keyword arguments are ``EngineConfig`` fields (``kv_cache_space``, ``max_num_seqs``,
    ``chat_template``...)."""

    def __init__(self, model: str | None = None, **engine_kwargs: Any):
        from ortserve.engine.config import EngineConfig
        from ortserve.engine.llm_engine import LLMEngine

        config = EngineConfig(model=None if model is None else str(model), **engine_kwargs)
        self.engine = LLMEngine.from_config(config)
        self.prompts = ChatPrompts(self.engine.tokenizer)
        artifact = self.engine.info().artifact_dir
        self._sampling_defaults = model_sampling_defaults(artifact) if config.generation_config == "auto" else {}
        self._ids = itertools.count()

    def get_tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | list[Prompt],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Complete each prompt (text, token ids, or vLLM's {"prompt": ...} / {"prompt_token_ids": ...}
        dicts); outputs in the order of the prompts."""
        single = isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        )
        return self._run([self._prompt(p) for p in ([prompts] if single else prompts)], sampling_params, use_tqdm)

    def _prompt(self, prompt: Any) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of one prompt; a ValueError naming the form for anything else."""
        if isinstance(prompt, str):
            return prompt, self.prompts.encode(prompt)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self._token_ids(prompt["prompt_token_ids"])
            if isinstance(prompt.get("prompt"), str):
                return prompt["prompt"], self.prompts.encode(prompt["prompt"])
            raise ValueError(
                f"a prompt dict needs 'prompt' (text) or 'prompt_token_ids' (token ids); this one has {sorted(prompt)}"
            )
        return None, self._token_ids(prompt)

    @staticmethod
    def _token_ids(ids: Any) -> list[int]:
        if isinstance(ids, (str, bytes)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise ValueError("a prompt is text, a list of token ids (ints), or a dict holding one of them")
        return list(ids)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"} messages) or a list of them,
        through the model's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        batch = []
        for conversation in conversations:
            text = self.prompts.render_chat(
                conversation,
                add_generation_prompt,  # type: ignore[arg-type]
                template_kwargs=chat_template_kwargs,
            )
            batch.append((text, self.prompts.encode(text, add_special_tokens=False)))
        return self._run(batch, sampling_params, use_tqdm)

    def get_default_sampling_params(self) -> SamplingParams:
        """What a call without SamplingParams samples with (vLLM's method of the same name): the
        model's generation_config.json values (temperature, top_p, top_k, min_p,
        repetition_penalty, max_new_tokens) over SamplingParams' defaults, unless
        ``generation_config="vllm"``."""
        return SamplingParams(**self._sampling_defaults)  # type: ignore[arg-type]

    def _run(
        self,
        batch: list[tuple[str | None, list[int]]],
        sampling_params: SamplingParams | list[SamplingParams] | None,
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        from tqdm.auto import tqdm

        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or self.get_default_sampling_params()] * len(batch)
        if len(sampling_params) != len(batch):
            raise ValueError(f"got {len(sampling_params)} SamplingParams for {len(batch)} prompts")
        engine = self.engine
        results: dict[str, RequestOutput] = {}
        try:
            for (text, ids), params in zip(batch, sampling_params):
                ids = params.truncate(ids)
                request_id = str(next(self._ids))
                engine.add_request(request_id, ids, params)
                results[request_id] = RequestOutput(
                    request_id, text, ids, [CompletionOutput(i) for i in range(params.n)]
                )
            with tqdm(total=len(results), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True) as bar:
                started, generated = time.perf_counter(), 0
                for delta in engine.run():
                    result = results[delta.request_id]
                    result.add(delta)
                    generated += sum(len(d.token_ids) for d in delta.samples)
                    if result.finished:
                        bar.update(1)
                        bar.set_postfix_str(
                            f"output {generated / (time.perf_counter() - started):.1f} tok/s", refresh=False
                        )
        except BaseException:
            engine.abort_requests([r for r, out in results.items() if not out.finished])
            for _ in engine.run():
                pass
            raise
        return list(results.values())
