"""The offline API: ``LLM(model).generate(prompts, SamplingParams)`` and ``.chat(messages)``.

The engine core runs in the caller's process and thread (pinned to the engine's first core
unless ``threads_bind="nobind"``); the output processor turns its token ids into text, and
stop strings it finishes are aborted in the core, as the server does across processes.
"""
from __future__ import annotations

import itertools
import time
from typing import Any

from ortserve.engine.output_processor import CompletionOutput, OutputProcessor, RequestOutput
from ortserve.sampling_params import SamplingParams

Prompt = str | list[int]
Message = dict[str, Any]


class LLM:
    """``model``: an artifact directory or a built-in model name (default: the embedded SmolLM2).
    Other keyword arguments are ``EngineConfig`` fields (``kv_cache_space``, ``max_num_seqs``...)."""

    def __init__(self, model: str | None = None, **engine_kwargs: Any):
        from transformers import AutoTokenizer

        from ortserve.engine.config import EngineConfig
        from ortserve.engine.core import EngineCore

        self.engine = EngineCore(EngineConfig(model=None if model is None else str(model), **engine_kwargs))
        self.tokenizer = AutoTokenizer.from_pretrained(self.engine.tokenizer_dir)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, prompts: Prompt | list[Prompt], sampling_params: SamplingParams | list[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Complete each prompt (text, or token ids); outputs in the order of the prompts."""
        if isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        texts = [p if isinstance(p, str) else None for p in prompts]
        token_ids = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        return self._run(token_ids, texts, sampling_params, use_tqdm)

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | list[SamplingParams] | None = None, use_tqdm: bool = True,
             add_generation_prompt: bool = True, chat_template_kwargs: dict[str, Any] | None = None
             ) -> list[RequestOutput]:
        """Answer one conversation (a list of {"role", "content"} messages) or a list of them,
        through the model's chat template."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        texts = [self.tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                    **(chat_template_kwargs or {})) for c in conversations]
        token_ids = [self.tokenizer.encode(t, add_special_tokens=False) for t in texts]
        return self._run(token_ids, texts, sampling_params, use_tqdm)

    def _run(self, token_ids: list[list[int]], texts: list[str | None],
             sampling_params: SamplingParams | list[SamplingParams] | None, use_tqdm: bool) -> list[RequestOutput]:
        from tqdm.auto import tqdm

        from ortserve.engine.messages import EngineRequest

        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            sampling_params = [sampling_params or SamplingParams()] * len(token_ids)
        if len(sampling_params) != len(token_ids):
            raise ValueError(f"got {len(sampling_params)} SamplingParams for {len(token_ids)} prompts")
        engine, processor = self.engine, OutputProcessor(self.tokenizer)
        order = [f"{next(self._ids)}" for _ in token_ids]
        finals: dict[str, RequestOutput] = {}
        try:
            for request_id, ids, text, params in zip(order, token_ids, texts, sampling_params):
                engine.add_request(EngineRequest(request_id, ids, params))
                processor.add_request(request_id, ids, params, prompt=text)
            with tqdm(total=len(order), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True) as bar:
                started, generated = time.perf_counter(), 0
                while processor.has_unfinished_requests():
                    core_outputs = engine.step()
                    generated += sum(len(o.new_token_ids) for o in core_outputs)
                    request_outputs, to_abort = processor.process_outputs(core_outputs)
                    if to_abort:
                        engine.abort_requests(to_abort)
                    for output in request_outputs:
                        _merge(finals, output)
                        if output.finished:
                            bar.update(1)
                            bar.set_postfix_str(f"output {generated / (time.perf_counter() - started):.1f} tok/s",
                                                refresh=False)
            while engine.has_unfinished_requests():  # deliver the aborts of stop-string finishes
                engine.step()
        except BaseException:
            engine.abort_requests([r for r in order if r not in finals or not finals[r].finished])
            while engine.has_unfinished_requests():
                engine.step()
            raise
        return [finals[r] for r in order]


def _merge(finals: dict[str, RequestOutput], output: RequestOutput) -> None:
    """Keep the latest state of every sample of a request."""
    known = finals.get(output.request_id)
    if known is None:
        finals[output.request_id] = known = RequestOutput(output.request_id, output.prompt_token_ids, [], False,
                                                          output.prompt, output.num_cached_tokens)
    by_index: dict[int, CompletionOutput] = {c.index: c for c in known.outputs}
    by_index.update({c.index: c for c in output.outputs})
    known.outputs = [by_index[i] for i in sorted(by_index)]
    known.finished = output.finished
    known.num_cached_tokens = output.num_cached_tokens
