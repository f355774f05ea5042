"""Turns a scheduled step into the graph's flattened-batch inputs and runs it.

- One ``InferenceSession`` with the ortserve op library, ``ORT_ENABLE_ALL``, one intra-op thread
  per planned core (pool threads pinned through ``session.intra_op_thread_affinities``, the calling
  thread pinned by the engine), and spinning on when the cores are ours. When other work takes turns
  with it on the same cores, it stops spinning at the end of each run (``session.force_spinning_stop``;
  the engine decides, ``core.pool_shares_cores``): a draft model's session (a SmolLM2 fp32 step of 5
  tokens took 56 ms with the int4 draft's threads spinning beside it and 34 ms without), or the HTTP
  process of a server with no core of its own. Offline, the pool keeps spinning between runs.
- The per-layer KV caches are numpy arrays allocated once from the KV plan, wrapped as OrtValues
  and bound once, each as both the cache input and the cache output (the op writes them in place
  and checks the pointers are equal). The artifact's graph declares fp32 caches; for fp16 or int8
  rows (``--kv-cache-dtype``) the graph is loaded with its cache types and widths rewritten (the
  weights stay in the artifact's data file), and PackedPagedAttention picks its kernel by type.
- Per step: the seven small index arrays are built with vectorised numpy (per-sequence Python only,
  never per token; a plain decode batch in half the calls), copied into the buffers bound to the
  graph's inputs (a new buffer is bound only when a shape changes), the logits output is bound to
  a preallocated buffer with one row per sampling sequence, and the session runs once. After a
  step has swept the CPU caches every numpy call costs ~40 us instead of ~4 (an argmax over 49,152
  logits, AMD EPYC Zen 4), so the calls a step makes are counted.

Inputs, for B sequences with q_b new tokens each (T = sum q_b):
  input_ids[T], positions[T] = num_computed_b + i, slot_mapping[T] = block*block_size + offset,
  block_tables[B, max blocks], context_lens[B] = num_computed_b + q_b,
  query_start_loc[B+1] = prefix sums of q_b, logits_indices[N] = last row of each sampling sequence.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from ortserve import ops
from ortserve.artifact import (
    COMPACT_KV_OP_VERSION,
    KV_ROW,
    LOGITS_OUTPUT,
    MODEL_FILE,
    STEP_INPUTS,
    ArtifactError,
    ArtifactManifest,
)
from ortserve.engine import huge_pages
from ortserve.engine.memory import KVCachePlan
from ortserve.engine.scheduler import ScheduledBatch
from ortserve.engine.threads import ThreadPlan


class ModelRunner:
    def __init__(
        self,
        artifact_dir: Path,
        manifest: ArtifactManifest,
        kv_plan: KVCachePlan,
        threads: ThreadPlan,
        max_num_seqs: int,
        options: ort.SessionOptions | None = None,
        shares_cores: bool = False,
    ):
        """``options``: SessionOptions to use instead of the planned ones (profiling, in the
        benchmarks); the op library is registered on them. ``shares_cores``: other work runs
        on the same cores between this one's runs (a draft model's session, the HTTP process)."""
        self.manifest = manifest
        self.block_size = kv_plan.block_size
        self.num_blocks = kv_plan.num_blocks
        if options is not None:
            ops.register(options)
        options = options or session_options(threads, shares_cores)
        with huge_pages.weights_on_huge_pages():
            self.session = ort.InferenceSession(
                graph_for_kv_dtype(Path(artifact_dir), manifest, kv_plan.dtype, options),
                options,
                providers=["CPUExecutionProvider"],
            )
        width = manifest.kv_row_width(kv_plan.dtype)
        shape = (kv_plan.num_blocks, manifest.num_kv_heads, kv_plan.block_size, width)
        # One allocation for every layer's caches: numpy backs arrays of 4 MiB or more with huge
        # pages, and one layer's alone may be smaller (a PagedRunner's few blocks: its attention ran
        # 10-20 % slower on 4 KiB pages). Committed now, not page by page inside decode steps.
        caches = np.zeros((2 * manifest.num_layers, *shape), KV_ROW[kv_plan.dtype][0])
        huge_pages.populate([caches])
        self.kv_caches = list(caches)  # per layer: key, value (contiguous views)
        self._kv_values = [ort.OrtValue.ortvalue_from_numpy(a) for a in self.kv_caches]
        self.binding = self.session.io_binding()
        for layer in range(manifest.num_layers):
            for value, name_in, name_out in (
                (self._kv_values[2 * layer], manifest.key_cache_input(layer), manifest.key_cache_output(layer)),
                (self._kv_values[2 * layer + 1], manifest.value_cache_input(layer), manifest.value_cache_output(layer)),
            ):
                self.binding.bind_ortvalue_input(name_in, value)
                self.binding.bind_ortvalue_output(name_out, value)
        self.logits = np.empty((max_num_seqs, manifest.vocab_size), np.float32)
        self._bound: dict[str, np.ndarray] = {}  # per step input: the buffer its OrtValue wraps
        self._bound_logits: tuple[int, int] | None = None  # (id, rows) of the bound logits array
        self.model_seconds = 0.0  # time inside session.run, cumulative

    def execute(self, batch: ScheduledBatch, all_logits: bool = False) -> np.ndarray:
        """Run one step; returns logits [len(batch.sampling), vocab] (with ``all_logits``, one row
        per scheduled token: teacher forcing), a view valid until the next step."""
        inputs = self.prepare_inputs(batch, all_logits)
        num_rows = inputs["logits_indices"].size
        for graph_input in STEP_INPUTS:
            value = inputs[graph_input.name]
            assert value.dtype == graph_input.dtype, graph_input
            self._bind_input(graph_input.name, value)
        if num_rows > len(self.logits):
            self.logits = np.empty((num_rows, self.manifest.vocab_size), np.float32)
        if self._bound_logits != (id(self.logits), num_rows):
            self.binding.bind_output(
                LOGITS_OUTPUT, "cpu", 0, np.float32, [num_rows, self.manifest.vocab_size], self.logits.ctypes.data
            )
            self._bound_logits = (id(self.logits), num_rows)  # the array is kept: its id stays its own
        start = time.perf_counter()
        self.session.run_with_iobinding(self.binding)
        self.model_seconds += time.perf_counter() - start
        return self.logits[:num_rows]

    def _bind_input(self, name: str, value: np.ndarray) -> None:
        """Steps of one shape (decode at a steady batch) reuse the bound buffer: the values are
        copied into the memory its OrtValue wraps, and only a new shape binds a new buffer.
        Binding costs ~20 us an input after a step has swept the caches (SmolLM2 int4 decode,
        AMD EPYC Zen 4: 7 inputs, 0.17 ms of a step's 0.63 ms of Python)."""
        buffer = self._bound.get(name)
        if buffer is not None and buffer.shape == value.shape:
            np.copyto(buffer, value)
            return
        buffer = np.array(value, copy=True)  # ours: the caller's array may be reused
        self.binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(buffer))
        self._bound[name] = buffer

    def prepare_inputs(self, batch: ScheduledBatch, all_logits: bool = False) -> dict[str, np.ndarray]:
        if not all_logits and all(
            n == 1 and s.num_computed_tokens + 1 == s.num_tokens and not (s.num_draft_tokens or s.wants_prompt_logprobs)
            for s, n in zip(batch.seqs, batch.num_new_tokens)
        ):
            return self.decode_inputs(batch)
        return self.step_inputs(batch, all_logits)

    def decode_inputs(self, batch: ScheduledBatch) -> dict[str, np.ndarray]:
        """``step_inputs`` of a batch whose every sequence computes its last token and samples
        (plain decode), in half the numpy calls: 0.2 of a step's 0.63 ms of Python went to
        building the inputs (SmolLM2 int4 decode, one sequence, AMD EPYC Zen 4)."""
        seqs = batch.seqs
        num_seqs, block_size = len(seqs), self.block_size
        positions = np.fromiter((s.num_computed_tokens for s in seqs), np.int64, num_seqs)
        ids = np.fromiter((s.token_ids[-1] for s in seqs), np.int64, num_seqs)
        block_tables = self._block_tables([s.block_table for s in seqs])
        slot_mapping = (
            block_tables[np.arange(num_seqs), positions // block_size].astype(np.int64) * block_size
            + positions % block_size
        )
        return {
            "input_ids": ids,
            "positions": positions,
            "slot_mapping": slot_mapping,
            "block_tables": block_tables,
            "context_lens": (positions + 1).astype(np.int32),
            "query_start_loc": np.arange(num_seqs + 1, dtype=np.int32),
            "logits_indices": np.arange(num_seqs, dtype=np.int64),
        }

    @staticmethod
    def _block_tables(tables: list[list[int]]) -> np.ndarray:
        """[B, longest table] int32, zero-padded."""
        if len(tables) == 1:
            return np.array(tables, np.int32)
        num_table_blocks = np.fromiter(map(len, tables), np.int64, len(tables))
        block_tables = np.zeros((len(tables), int(num_table_blocks.max())), np.int32)
        block_tables[np.arange(block_tables.shape[1]) < num_table_blocks[:, None]] = list(
            itertools.chain.from_iterable(tables)
        )
        return block_tables

    def step_inputs(self, batch: ScheduledBatch, all_logits: bool = False) -> dict[str, np.ndarray]:
        """The graph's inputs for any batch (see the module doc)."""
        seqs = batch.seqs
        num_seqs = len(seqs)
        block_size = self.block_size
        starts = np.fromiter((s.num_computed_tokens for s in seqs), np.int64, num_seqs)
        q_lens = np.array(batch.num_new_tokens, np.int64)
        query_start_loc = np.zeros(num_seqs + 1, np.int64)
        np.cumsum(q_lens, out=query_start_loc[1:])
        context_lens = starts + q_lens
        ids = np.concatenate(
            [
                np.frombuffer(s.token_ids[c : c + n], np.int64)
                for s, c, n in zip(seqs, starts.tolist(), batch.num_new_tokens)
            ]
        )
        row_of_token = np.repeat(np.arange(num_seqs), q_lens)
        positions = np.arange(ids.size, dtype=np.int64) - (query_start_loc[:-1] - starts)[row_of_token]
        block_tables = self._block_tables([s.block_table for s in seqs])
        slot_mapping = (
            block_tables[row_of_token, positions // block_size].astype(np.int64) * block_size + positions % block_size
        )
        if all_logits:
            logits_indices = np.arange(ids.size, dtype=np.int64)
        else:  # the last rows of each sequence's chunk: one when it samples, all for prompt logprobs
            rows = np.array(batch.logits_rows(), np.int64)
            first = np.repeat(query_start_loc[1:] - rows, rows)  # each sequence's first row
            logits_indices = first + np.arange(first.size) - np.repeat(np.cumsum(rows) - rows, rows)
        return {
            "input_ids": ids,
            "positions": positions,
            "slot_mapping": slot_mapping,
            "block_tables": block_tables,
            "context_lens": context_lens.astype(np.int32),
            "query_start_loc": query_start_loc.astype(np.int32),
            "logits_indices": logits_indices,
        }


def graph_for_kv_dtype(
    artifact_dir: Path, manifest: ArtifactManifest, dtype: str, options: ort.SessionOptions
) -> str | bytes:
    """The artifact's model file for fp32 caches; for fp16 / int8 caches, its graph (without the
    weights) with the caches' element type and last dimension rewritten, which ONNX Runtime loads
    with the weights from the artifact's folder."""
    if dtype == "fp32":
        return str(artifact_dir / MODEL_FILE)
    if manifest.op_version < COMPACT_KV_OP_VERSION:
        raise ArtifactError(
            f"--kv-cache-dtype {dtype} needs an artifact of op_version {COMPACT_KV_OP_VERSION} or later; "
            f"{artifact_dir} has {manifest.op_version}: re-export it (ortserve export SRC -o DIR) or use "
            f"--kv-cache-dtype fp32"
        )
    import onnx

    model = onnx.load(str(artifact_dir / MODEL_FILE), load_external_data=False)
    elem_type = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(KV_ROW[dtype][0]))
    caches = {name for layer in range(manifest.num_layers) for name in manifest.cache_names(layer)}
    for value in [*model.graph.input, *model.graph.output]:
        if value.name in caches:
            value.type.tensor_type.elem_type = elem_type
            value.type.tensor_type.shape.dim[3].dim_value = manifest.kv_row_width(dtype)
    options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(artifact_dir))
    serialized: bytes = model.SerializeToString()
    return serialized


def session_options(threads: ThreadPlan, shares_cores: bool = False) -> ort.SessionOptions:
    options = ort.SessionOptions()
    ops.register(options)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = threads.num_threads
    options.inter_op_num_threads = 1
    options.enable_mem_pattern = False  # shapes change every step: a recorded pattern never applies
    if threads.bind and threads.num_threads > 1:
        options.add_session_config_entry("session.intra_op_thread_affinities", threads.ort_affinities())
    # Spin between parallel sections only when the cores are ours (pinned); with nobind the
    # threads share cores with other work and should sleep.
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if threads.bind else "0")
    if shares_cores:  # and stop when a run ends: spinning threads would take the cores from the other work
        options.add_session_config_entry("session.force_spinning_stop", "1")
    return options
