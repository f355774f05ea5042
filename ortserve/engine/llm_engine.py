"""LLMEngine: the request lifecycle above ``EngineCore`` (nano-vllm's llm_engine.py, vLLM's LLMEngine).

It owns the one loop body of the project: ``step()`` runs a core step, turns its token ids into
text deltas (``OutputProcessor``: detokenisation, stop strings), ends in the core the samples a
stop string finished, and returns one ``RequestDelta`` per request that changed. The offline
``LLM``, ``ortserve generate`` and the server's engine process all drive this class; nothing
else steps the core.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ortserve.engine.ipc import EngineInfo, EngineRequest, RequestDelta, StatsUpdate
from ortserve.engine.output_processor import OutputProcessor
from ortserve.sampling_params import SamplingParams

logger = logging.getLogger("ortserve.engine")


class LLMEngine:
    def __init__(self, core: Any, tokenizer: Any, stream_interval: int = 1) -> None:
        """``core``: an ``EngineCore`` (or a stand-in with the same methods, in tests);
        ``stream_interval``: a request's changes go out every this many tokens (OutputProcessor)."""
        self.core = core
        self.tokenizer = tokenizer
        self.processor = OutputProcessor(tokenizer, stream_interval)

    @classmethod
    def from_config(cls, config: Any, served: bool = False) -> LLMEngine:
        """The real engine for an ``EngineConfig`` (it resolves the model, exporting on first use);
        ``served``: in the server's engine process (EngineCore)."""
        from ortserve.engine.core import EngineCore
        from ortserve.tokenizer import load_tokenizer

        core = EngineCore(config, served=served)
        tokenizer = load_tokenizer(core.tokenizer_dir, config.chat_template)
        core.enable_structured_outputs(tokenizer)
        return cls(core, tokenizer, config.stream_interval)

    def info(self) -> EngineInfo:
        return self.core.info()  # type: ignore[no-any-return]

    # -- requests --------------------------------------------------------------------------------
    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams) -> None:
        """Queue a request; raises InvalidParameter (a ValueError naming the field) if it can
        never be served."""
        self.core.add_request(EngineRequest(request_id, list(prompt_token_ids), params))
        self.processor.add_request(request_id, prompt_token_ids, params)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.processor.abort_requests(request_ids)
        self.core.abort_requests(request_ids)

    def has_unfinished_requests(self) -> bool:
        return bool(self.core.has_unfinished_requests())

    # -- the loop body ---------------------------------------------------------------------------
    def step(self) -> list[RequestDelta]:
        deltas, to_abort = self.processor.process_outputs(self.core.step())
        if to_abort:  # finished by a stop string, which only the detokeniser sees
            self.core.abort_requests(to_abort)
        return deltas

    def stats(self) -> StatsUpdate:
        return self.core.stats()  # type: ignore[no-any-return]

    def run(self) -> Iterator[RequestDelta]:
        """Step until every request has finished, yielding the deltas (the offline loop)."""
        while self.has_unfinished_requests():
            yield from self.step()
