"""The engine core: requests in, token deltas out, one ``step()`` at a time (vLLM v1's EngineCore).

Start-up, in order: resolve the model to an artifact, plan the threads, plan the KV cache and
check it fits in memory (before anything big is loaded), settle max_model_len, load the session,
pin the calling thread, warm up, and log one summary block. Each step then runs
schedule -> model runner (while a worker thread computes the grammar masks of structured
outputs) -> prompt logprobs of the rows that asked -> sampler -> scheduler update.

``LLMEngine`` (engine/llm_engine.py) drives it: in the server's engine process and in the offline
``LLM``'s. Messages in and out are the msgspec structs of ``engine.ipc``.

Faults are contained: a step whose model run raises ends the requests of that batch with
finish reason "error" and the core goes on; a sampler failure is retried row by row, so only
the rows that fail alone end.
"""

from __future__ import annotations

import logging
import os
import platform
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from ortserve.artifact import ArtifactManifest, is_artifact, load_manifest
from ortserve.engine.block_manager import BlockManager
from ortserve.engine.config import DEFAULT_KV_CACHE_SPACE_GIB, EngineConfig
from ortserve.engine.draft import load_draft_proposer, resolve_draft
from ortserve.engine.grammar import GrammarCompiler, MaskWorker
from ortserve.engine.ipc import EngineCoreOutput, EngineInfo, EngineRequest, StatsUpdate, TokenLogprob
from ortserve.engine.memory import GIB, KVCachePlan, MemoryCheckError, plan_kv_cache
from ortserve.engine.sampler import Sampler, prompt_token_logprobs
from ortserve.engine.scheduler import ScheduledBatch, Scheduler
from ortserve.engine.sequence import Request, Sequence
from ortserve.engine.speculative import NgramProposer, Proposer
from ortserve.engine.threads import ThreadPlan, bind_memory, cores_left, pin_calling_thread, plan_threads
from ortserve.sampling_params import InvalidParameter, PromptLimits, SamplingParams

__all__ = ["EngineCore", "MemoryCheckError"]

logger = logging.getLogger("ortserve.engine")


class EngineCore:
    def __init__(self, config: EngineConfig | None = None, served: bool = False):
        """``served``: in the server's engine process, whose HTTP process streams every token on the
        engine's cores unless --reserved-cpus leaves it others."""
        self.config = config = config or EngineConfig()
        self.artifact_dir = resolve_artifact(config.model, config.precision, config.activation_bits)
        self.manifest = manifest = load_manifest(self.artifact_dir)
        draft = resolve_draft(config, manifest) if config.speculative == "draft" else None  # checked before loading
        self.threads = plan_threads(config.threads_bind, config.reserved_cpus, config.threads)
        self.memory_nodes = bind_memory(self.threads)  # before the weights and the KV cache are allocated
        self.kv_plan = plan_kv_cache(
            manifest,
            config.block_size,
            config.kv_cache_space,
            DEFAULT_KV_CACHE_SPACE_GIB,
            dtype=manifest.kv_cache_row_dtype(config.kv_cache_dtype),
        )
        self.max_model_len = settle_max_model_len(config, manifest, self.kv_plan)
        self.limits = PromptLimits(self.max_model_len, manifest.vocab_size)
        self.eos_token_ids = frozenset(manifest.eos_token_ids)
        from ortserve.engine.model_runner import ModelRunner  # onnxruntime: only where it runs

        started = time.perf_counter()
        self.runner = ModelRunner(
            self.artifact_dir,
            manifest,
            self.kv_plan,
            self.threads,
            config.max_num_seqs,
            shares_cores=pool_shares_cores(config, self.threads, served),  # reads the affinity: before pinning
        )
        pin_calling_thread(self.threads)
        self.block_manager = BlockManager(self.kv_plan.num_blocks, config.block_size, config.enable_prefix_caching)
        proposer: Proposer | None = None
        if config.speculative == "ngram":
            proposer = NgramProposer(config.num_speculative_tokens, config.ngram_min, config.ngram_max)
        elif draft is not None:
            proposer = load_draft_proposer(config, *draft, self.kv_plan, self.threads)
        self.scheduler = Scheduler(
            self.block_manager, config.max_num_seqs, config.max_num_batched_tokens, proposer, config.max_drafting_seqs
        )
        self.sampler = Sampler()
        self.grammars: GrammarCompiler | None = None  # set by enable_structured_outputs
        self.masks: MaskWorker | None = None
        self._pending: list[EngineCoreOutput] = []  # abort outputs, delivered by the next step()
        self._num_steps = 0
        self._step_seconds = 0.0
        self._reported = StatsUpdate()  # cumulative values at the last stats() call
        self._warm_up()
        logger.info("%s", startup_report(self, time.perf_counter() - started))

    # -- facts the API side needs ------------------------------------------------------------
    @property
    def tokenizer_dir(self) -> Path:
        return self.artifact_dir  # the exporter copies the tokenizer files into the artifact

    def info(self) -> EngineInfo:
        return EngineInfo(
            artifact_dir=str(self.artifact_dir),
            max_model_len=self.max_model_len,
            vocab_size=self.manifest.vocab_size,
            max_num_seqs=self.config.max_num_seqs,
            engine_cores=list(self.threads.cores) if self.threads.bind else [],
        )

    def enable_structured_outputs(self, tokenizer: Any) -> None:
        """Grammars need the tokenizer (llguidance reads its vocabulary; built in the background)."""
        self.grammars = GrammarCompiler(tokenizer, self.manifest.vocab_size, sorted(self.eos_token_ids))
        self.masks = MaskWorker(self.manifest.vocab_size, self.threads.cores if self.threads.bind else ())

    # -- requests ------------------------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        """Queue a request, or raise InvalidParameter naming the limit and what changes it
        (the same ``PromptLimits`` check the server makes before sending it, and the grammar's)."""
        if request.request_id in self.scheduler.requests:
            raise InvalidParameter("request_id", f"request id {request.request_id!r} is already running")
        self.limits.check(request.prompt_token_ids, request.sampling_params)
        spec = request.sampling_params.structured_outputs
        new_grammar = None
        if spec is not None:
            if self.grammars is None:
                raise InvalidParameter("structured_outputs", "this engine was started without a tokenizer for grammars")
            new_grammar = self.grammars.matcher(spec).deep_copy  # compiled once, copied per sample
        self.scheduler.add(Request(request, self.eos_token_ids, self.max_model_len, new_grammar))

    def abort_requests(self, request_ids: Iterable[str | tuple[str, int]]) -> None:
        """End requests now and free their blocks. An entry is a request id, or (request id,
        sample index) for one sample of n. Their 'abort' outputs come with the next step()."""
        for entry in request_ids:
            request_id, index = (entry, None) if isinstance(entry, str) else entry
            self._pending += self.scheduler.abort(request_id, index)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self._pending)

    # -- the loop body -------------------------------------------------------------------------
    def step(self) -> list[EngineCoreOutput]:
        started = time.perf_counter()
        outputs, self._pending = self._pending, []
        batch = self.scheduler.schedule()
        if batch:
            masks = self.masks.start([s.grammar for s in batch.sampling]) if self.masks else None
            try:
                logits = self.runner.execute(batch)
            except Exception:
                logger.exception("the model run failed; ending the %d requests of this step", len(batch.seqs))
                if masks is not None:
                    masks.exception()  # the worker is done with the matchers before they go
                return outputs + self._fail(dict.fromkeys(s.request.request_id for s in batch.seqs))
            logits = self._take_prompt_logprobs(logits, batch)
            try:
                bitmask = masks.result() if masks is not None else None
            except Exception:
                logger.exception("computing the grammar masks failed; ending the requests with a grammar")
                return outputs + self._fail(dict.fromkeys(s.request.request_id for s in batch.seqs if s.grammar))
            tokens, logprobs, failed = self._sample(logits, batch, bitmask)
            updated = self.scheduler.update(batch, tokens, logprobs)
            outputs += [o for o in updated if o.request_id not in failed] if failed else updated
            outputs += self._fail(failed)
            self._num_steps += 1
        self._step_seconds += time.perf_counter() - started
        return outputs

    def _take_prompt_logprobs(self, logits: np.ndarray, batch: ScheduledBatch) -> np.ndarray:
        """Record the prompt logprobs of the sequences that asked (their rows come from this same
        prefill, chunk by chunk); returns the sampling rows, one per ``batch.sampling`` (and one
        per draft token of a speculating sequence)."""
        if not any(s.wants_prompt_logprobs for s in batch.seqs):
            return logits  # one row per sampling sequence already
        rows = batch.logits_rows()
        offset, sampling = 0, list[int]()
        for seq, num_new, num_rows in zip(batch.seqs, batch.num_new_tokens, rows):
            start = seq.num_computed_tokens  # row k is position start + k and predicts token start + k + 1
            if seq.prompt_logprobs is not None and seq.wants_prompt_logprobs:
                first = max(0, len(seq.prompt_logprobs) - start)  # a recompute after preemption has some
                last = min(num_rows, seq.num_prompt_tokens - 1 - start)
                if last > first:
                    targets = np.frombuffer(seq.token_ids[start + first + 1 : start + last + 1], np.int64)
                    k = seq.params.prompt_logprobs or 0
                    seq.prompt_logprobs += prompt_token_logprobs(logits[offset + first : offset + last], targets, k)
            if start + num_new == seq.num_tokens:  # its last row, and one per speculative draft
                sampling.extend(range(offset + num_rows - 1 - seq.num_draft_tokens, offset + num_rows))
            offset += num_rows
        return logits[sampling]

    def _sample(
        self, logits: np.ndarray, batch: ScheduledBatch, bitmask: np.ndarray | None = None
    ) -> tuple[list[list[int]], list[list[TokenLogprob] | None] | None, list[str]]:
        """The batch's tokens, per sampling sequence; if the sampler raises, each sequence alone,
        and the requests whose rows still raise are returned to be failed (their rows get a
        placeholder token first)."""
        seqs = batch.sampling
        try:
            tokens, logprobs = self._sample_rows(logits, seqs, bitmask)
            return tokens, logprobs, []
        except Exception:
            logger.exception("sampling a batch of %d sequences failed; retrying one by one", len(seqs))
        tokens, rows, failed = [], [], []
        first = 0
        for i, seq in enumerate(seqs):
            count = 1 + seq.num_draft_tokens
            try:
                mask = bitmask[i : i + 1] if bitmask is not None else None
                token, row = self._sample_rows(logits[first : first + count].copy(), [seq], mask)
            except Exception:
                logger.exception("sampling request %s failed", seq.request.request_id)
                token, row = [[0]], None
                failed.append(seq.request.request_id)
            first += count
            tokens += token
            rows.append(row[0] if row else None)
        wanted = any(s.params.logprobs is not None for s in seqs)
        return tokens, (rows if wanted else None), failed

    def _sample_rows(
        self, logits: np.ndarray, seqs: list[Sequence], bitmask: np.ndarray | None
    ) -> tuple[list[list[int]], list[list[TokenLogprob] | None] | None]:
        """Plain sequences through ``Sampler.sample``, speculating ones through ``verify``."""
        drafts = [s.draft_token_ids for s in seqs]
        if not any(drafts):
            tokens, logprobs = self.sampler.sample(logits, seqs, bitmask)
            return [[t] for t in tokens], None if logprobs is None else [None if r is None else [r] for r in logprobs]
        return self.sampler.verify(logits, seqs, drafts)  # drafts only where there is no grammar

    def _fail(self, request_ids: Iterable[str]) -> list[EngineCoreOutput]:
        outputs: list[EngineCoreOutput] = []
        for request_id in request_ids:
            outputs += self.scheduler.abort(request_id, reason="error")
        return outputs

    def stats(self) -> StatsUpdate:
        """Gauges now, and what the counters gained since the previous call."""
        counters, last = self.scheduler.counters, self._reported
        now = StatsUpdate(
            prefix_queries=counters.prefix_queries,
            prefix_hits=counters.prefix_hits,
            num_preemptions=counters.num_preemptions,
            num_draft_tokens=counters.num_draft_tokens,
            num_accepted_tokens=counters.num_accepted_tokens,
            prompt_tokens=counters.prompt_tokens,
            generation_tokens=counters.generation_tokens,
            num_steps=self._num_steps,
            step_seconds=self._step_seconds,
            model_seconds=self.runner.model_seconds,
        )
        update = StatsUpdate(
            num_running=len(self.scheduler.running),
            num_waiting=len(self.scheduler.waiting),
            kv_usage=self.block_manager.usage,
            ttft=counters.ttft,
            tpot=counters.tpot,
            e2e=counters.e2e,
            **{name: getattr(now, name) - getattr(last, name) for name in CUMULATIVE},
        )
        counters.ttft, counters.tpot, counters.e2e = [], [], []
        self._reported = now
        return update

    def _warm_up(self) -> None:
        """One throwaway step (ORT's first run allocates and prepacks), then reset the clocks."""
        length = min(self.config.block_size + 1, self.max_model_len - 1)
        self.add_request(EngineRequest("__warmup__", [0] * length, SamplingParams(max_tokens=1, temperature=0.0)))
        while self.scheduler.has_unfinished_requests():
            self.step()
        self.block_manager.check_idle()
        self.scheduler.counters = type(self.scheduler.counters)()
        self.runner.model_seconds = self._step_seconds = 0.0
        self._num_steps = 0
        self._reported = StatsUpdate()


CUMULATIVE = (
    "prefix_queries",
    "prefix_hits",
    "num_preemptions",
    "num_draft_tokens",
    "num_accepted_tokens",
    "prompt_tokens",
    "generation_tokens",
    "num_steps",
    "step_seconds",
    "model_seconds",
)


def pool_shares_cores(config: EngineConfig, threads: ThreadPlan, served: bool) -> bool:
    """Whether other work runs on the engine's pinned cores between its runs, so that its pool
    threads must stop spinning when a run ends: a draft model's session, or the HTTP process of a
    server that has no core of its own. Served SmolLM2 on 2 cores (AMD EPYC Zen 4), server runs with
    the pool stopping alternated with runs of the spinning code: int4 decode 1.05x (geometric mean of
    8 rounds' ratios, 0.85-1.20), 16 streams 1.07x (6 rounds, 0.96-1.25), fp32 decode 1.02x (5 rounds,
    0.90-1.25); the engine's time outside the model run a token 0.47-0.77 ms against 0.80-1.22
    (benchmarks/tables/amd_epyc_zen4.md). Offline nothing else runs there, and the pool spins."""
    if config.speculative == "draft":
        return True
    return served and threads.bind and not cores_left(threads.cores)


def resolve_artifact(model: str | None, precision: str | None, activation_bits: int) -> Path:
    """The artifact to load for a model argument: the artifact itself, or its cached export (made
    now on first use)."""
    if model is not None and is_artifact(model):
        return Path(model)
    from ortserve.models import resolve_model

    return Path(resolve_model(model, precision=precision, activation_bits=activation_bits))


def settle_max_model_len(config: EngineConfig, manifest: ArtifactManifest, kv: KVCachePlan) -> int:
    """The model's limit, or --max-model-len, and never more than the KV cache holds (so one
    request alone can always run to the end)."""
    if config.max_model_len is not None and config.max_model_len > manifest.max_model_len:
        raise MemoryCheckError(
            f"--max-model-len {config.max_model_len} is more than the model's maximum of "
            f"{manifest.max_model_len} tokens; use --max-model-len {manifest.max_model_len} or less"
        )
    wanted = config.max_model_len or manifest.max_model_len
    if wanted <= kv.num_tokens:
        return wanted
    if config.max_model_len is not None:
        need = -(-wanted // kv.block_size) * kv.bytes_per_block / GIB
        raise MemoryCheckError(
            f"--max-model-len {wanted} needs {need:.3g} GiB of KV cache but --kv-cache-space gives "
            f"{kv.total_bytes / GIB:.3g} GiB ({kv.num_tokens} tokens); raise --kv-cache-space to "
            f"{need * 1.01:.3g} or use --max-model-len {kv.num_tokens} or less"
        )
    logger.warning(
        "max_model_len lowered from %d to %d: the KV cache (--kv-cache-space %.3g GiB) holds no more",
        wanted,
        kv.num_tokens,
        kv.total_bytes / GIB,
    )
    return kv.num_tokens


def cpu_description() -> str:
    model, flags = platform.processor() or "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile") if f in flags]
    return f"{model} ({', '.join(isa) or 'no AVX2'})"


def startup_report(core: EngineCore, load_seconds: float) -> str:
    import onnxruntime

    m, kv, config, threads = core.manifest, core.kv_plan, core.config, core.threads
    per_token = m.kv_bytes_per_token(kv.dtype)
    return "\n".join(
        [
            "ortserve engine ready",
            (
                f"  model     {core.artifact_dir} ({m.architecture}, {m.num_parameters / 1e6:.0f}M parameters, "
                f"{m.weight_precision} weights {m.weight_bytes / GIB:.2f} GiB), loaded in {load_seconds:.1f} s"
            ),
            (
                f"  platform  {platform.system()} {platform.machine()}, {cpu_description()}, "
                f"{os.cpu_count()} CPUs online; onnxruntime {onnxruntime.__version__}, numpy {np.__version__}"
            ),
            f"  threads   {threads.describe()}"
            + (f"; memory bound to NUMA node {','.join(map(str, core.memory_nodes))}" if core.memory_nodes else ""),
            (
                f"  KV cache  {kv.num_blocks} blocks x {kv.block_size} tokens = {kv.num_tokens} tokens, "
                f"{kv.total_bytes / GIB:.2f} GiB ({per_token / 1024:.1f} KiB per token; {m.num_layers} layers x "
                f"{m.num_kv_heads} KV heads x {m.head_size}, {kv.dtype})"
            ),
            (
                f"  limits    max_model_len {core.max_model_len}; maximum concurrency for {core.max_model_len} tokens "
                f"per request: {kv.num_tokens / core.max_model_len:.2f}x"
            ),
            (
                f"  scheduler max_num_seqs {config.max_num_seqs}, "
                f"max_num_batched_tokens {config.max_num_batched_tokens}, "
                f"prefix caching {'on' if config.enable_prefix_caching else 'off'}, speculative "
                + speculative_summary(config)
            ),
        ]
    )


def speculative_summary(config: EngineConfig) -> str:
    if config.speculative == "off":
        return "off"
    what = f"n {config.ngram_min}..{config.ngram_max}" if config.speculative == "ngram" else str(config.draft_model)
    limit = config.max_drafting_seqs
    batch = f", while at most {limit} sequences decode" if limit is not None else ""
    return f"{config.speculative} ({what}; {config.num_speculative_tokens} tokens{batch})"
