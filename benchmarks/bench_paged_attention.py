"""Time ortserve.PagedAttention against ONNX Runtime's com.microsoft.GroupQueryAttention (fp32, CPU).

Shape: Qwen2.5-0.5B attention (14 query heads, 2 kv heads, head size 64). Each model chains
--layers attention nodes, each with its own KV cache (as in a real decoder, so a long cache does
not stay in the CPU cache between layers); figures are per layer. Cases:
  decode:  1, 8, 32 sequences x context 512 and 2048, one new token each;
  prefill: one 512-token prompt;
  extras:  32 decodes of ragged contexts 64..2048, and one step of a 256-token prefill chunk
           (context 1024) with 16 decodes (context 1024).
Each op gets its best configuration. PagedAttention: one call per step, cache blocks scattered
at random (as after a while of serving). GQA: past and present KV share one buffer (bound through
IOBinding); decodes go in one batch padded to the longest context ([B, kv, max_ctx, D]); a
multi-token sequence with past context needs its own batch-1 call (a CPU GQA limit), timed with
the rest of its step. Per-token figures divide by the step's new tokens.
Variants (op x threads) are interleaved round by round and medians taken, so load from other
processes hits all of them alike; the 1-vs-2-thread columns show scaling.

    python benchmarks/bench_paged_attention.py [--layers 4] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

import ortserve.ops

F, I32, I64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64
BLOCK_SIZE = 16


@dataclass(frozen=True)
class Shape:
    """An attention layer's heads: query heads, kv heads and head size."""

    heads: int
    kv_heads: int
    head_size: int = 64

    @property
    def q_width(self) -> int:
        return self.heads * self.head_size

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_size


QWEN = Shape(14, 2)  # Qwen2.5-0.5B
SMOLLM2 = Shape(9, 3)  # SmolLM2-135M


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "attention", inputs, outputs)
    return helper.make_model(
        graph,
        ir_version=10,
        opset_imports=[
            helper.make_opsetid("", 17),
            helper.make_opsetid("com.microsoft", 1),
            helper.make_opsetid(ortserve.ops.DOMAIN, ortserve.ops.OPSET_VERSION),
        ],
    )


def paged_model(layers, shape=QWEN):
    vi = helper.make_tensor_value_info
    cache = ["num_blocks", shape.kv_heads, BLOCK_SIZE, shape.head_size]
    inputs = [
        vi("query", F, ["T", shape.q_width]),
        vi("key", F, ["T", shape.kv_width]),
        vi("value", F, ["T", shape.kv_width]),
        vi("slot_mapping", I64, ["T"]),
        vi("block_tables", I32, ["B", "M"]),
        vi("context_lens", I32, ["B"]),
        vi("query_start_loc", I32, ["B1"]),
    ]
    outputs, nodes, query = [], [], "query"
    for layer in range(layers):
        inputs += [vi(f"key_cache.{layer}", F, cache), vi(f"value_cache.{layer}", F, cache)]
        outputs += [vi(f"key_cache_out.{layer}", F, cache), vi(f"value_cache_out.{layer}", F, cache)]
        nodes.append(
            helper.make_node(
                "PagedAttention",
                [
                    query,
                    "key",
                    "value",
                    f"key_cache.{layer}",
                    f"value_cache.{layer}",
                    "slot_mapping",
                    "block_tables",
                    "context_lens",
                    "query_start_loc",
                ],
                [f"out.{layer}", f"key_cache_out.{layer}", f"value_cache_out.{layer}"],
                domain=ortserve.ops.DOMAIN,
                num_heads=shape.heads,
                num_kv_heads=shape.kv_heads,
            )
        )
        query = f"out.{layer}"
    outputs.insert(0, vi(query, F, ["T", shape.q_width]))
    return _model(nodes, inputs, outputs)


def gqa_model(layers, shape=QWEN):
    vi = helper.make_tensor_value_info
    cache = ["B", shape.kv_heads, "L", shape.head_size]
    inputs = [
        vi("query", F, ["B", "S", shape.q_width]),
        vi("key", F, ["B", "S", shape.kv_width]),
        vi("value", F, ["B", "S", shape.kv_width]),
        vi("seqlens_k", I32, ["B"]),
        vi("total_sequence_length", I32, []),
    ]
    outputs, nodes, query = [], [], "query"
    for layer in range(layers):
        inputs += [vi(f"past_key.{layer}", F, cache), vi(f"past_value.{layer}", F, cache)]
        outputs += [vi(f"present_key.{layer}", F, cache), vi(f"present_value.{layer}", F, cache)]
        nodes.append(
            helper.make_node(
                "GroupQueryAttention",
                [
                    query,
                    "key",
                    "value",
                    f"past_key.{layer}",
                    f"past_value.{layer}",
                    "seqlens_k",
                    "total_sequence_length",
                ],
                [f"out.{layer}", f"present_key.{layer}", f"present_value.{layer}"],
                domain="com.microsoft",
                num_heads=shape.heads,
                kv_num_heads=shape.kv_heads,
            )
        )
        query = f"out.{layer}"
    outputs.insert(0, vi(query, F, ["B", "S", shape.q_width]))
    return _model(nodes, inputs, outputs)


def session(model, threads, library=None):
    """library: a build of the op library to time (default: the installed one)."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library or ortserve.ops.library_path())
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def paged_binding(sess, rng, layers, seqs, shape=QWEN):
    """One call for the whole step; seqs = [(context, new tokens), ...], blocks scattered."""
    blocks = [-(-ctx // BLOCK_SIZE) for ctx, _ in seqs]
    num_blocks = sum(blocks)
    physical = rng.permutation(num_blocks).astype(np.int32)
    tables = np.zeros((len(seqs), max(blocks)), np.int32)
    slots = []
    for i, ((ctx, q_len), n) in enumerate(zip(seqs, blocks)):
        tables[i, :n] = physical[sum(blocks[:i]) : sum(blocks[:i]) + n]
        pos = np.arange(ctx - q_len, ctx)
        slots.append(tables[i, pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
    T = sum(q for _, q in seqs)
    b = sess.io_binding()
    b.bind_output(sess.get_outputs()[0].name, "cpu")
    feeds = dict(
        query=rng.standard_normal((T, shape.q_width), np.float32),
        key=rng.standard_normal((T, shape.kv_width), np.float32),
        value=rng.standard_normal((T, shape.kv_width), np.float32),
        slot_mapping=np.concatenate(slots).astype(np.int64),
        block_tables=tables,
        context_lens=np.array([ctx for ctx, _ in seqs], np.int32),
        query_start_loc=np.concatenate([[0], np.cumsum([q for _, q in seqs])]).astype(np.int32),
    )
    for name, array in feeds.items():
        b.bind_cpu_input(name, array)
    keep = []
    for layer in range(layers):
        for kind in ("key", "value"):
            cache = ort.OrtValue.ortvalue_from_numpy(
                rng.standard_normal((num_blocks, shape.kv_heads, BLOCK_SIZE, shape.head_size), np.float32)
            )
            b.bind_ortvalue_input(f"{kind}_cache.{layer}", cache)
            b.bind_ortvalue_output(f"{kind}_cache_out.{layer}", cache)
            keep.append(cache)
    return [b], keep


def gqa_bindings(sess, rng, layers, seqs, shape=QWEN):
    """GQA's best shape for the same step: all decodes in one padded batch ([B, kv, max_ctx, D]
    buffer shared by past and present), and each multi-token sequence as its own batch-1 call
    (GQA cannot batch those with past context)."""
    decodes = [ctx for ctx, q in seqs if q == 1]
    groups = ([(decodes, 1)] if decodes else []) + [([ctx], q) for ctx, q in seqs if q > 1]
    bindings, keep = [], []
    for contexts, q_len in groups:
        B, max_ctx = len(contexts), max(contexts)
        b = sess.io_binding()
        b.bind_output(sess.get_outputs()[0].name, "cpu")
        feeds = dict(
            query=rng.standard_normal((B, q_len, shape.q_width), np.float32),
            key=rng.standard_normal((B, q_len, shape.kv_width), np.float32),
            value=rng.standard_normal((B, q_len, shape.kv_width), np.float32),
            seqlens_k=np.array(contexts, np.int32) - 1,
            total_sequence_length=np.array(max_ctx, np.int32),
        )
        for name, array in feeds.items():
            b.bind_cpu_input(name, array)
        for layer in range(layers):
            for kind in ("key", "value"):
                cache = ort.OrtValue.ortvalue_from_numpy(
                    rng.standard_normal((B, shape.kv_heads, max_ctx, shape.head_size), np.float32)
                )
                b.bind_ortvalue_input(f"past_{kind}.{layer}", cache)
                b.bind_ortvalue_output(f"present_{kind}.{layer}", cache)
                keep.append(cache)
        bindings.append(b)
    return bindings, keep


def time_block(sess, bindings, seconds):
    """Mean seconds per step (all of a step's runs) over back-to-back steps lasting ~`seconds`,
    after an untimed warm-up of about a quarter of that (wakes this session's pool thread)."""

    def step():
        for binding in bindings:
            sess.run_with_iobinding(binding)

    start = time.perf_counter()
    step()
    once = max(time.perf_counter() - start, 1e-6)
    for _ in range(int(seconds / 4 / once)):
        step()
    n = max(2, int(seconds / once))
    start = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - start) / n


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=4, help="attention nodes per model (own cache each)")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved repetitions; medians are reported")
    parser.add_argument("--block-seconds", type=float, default=0.15, help="timed runs per variant per round")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    L = args.layers
    load_before = os.getloadavg()[0]
    models = {"paged": paged_model(L), "gqa": gqa_model(L)}
    sessions = {(kind, t): session(models[kind], t) for kind in models for t in (1, 2)}

    # (label, [(context, new tokens) per sequence]); the last two go beyond the targets:
    # a ragged decode batch (contexts 64..2048) and a chunked-prefill step mixed with decodes.
    cases = [(f"decode {n:>2} x {c}", [(c, 1)] * n) for n in (1, 8, 32) for c in (512, 2048)]
    cases.append(("prefill 1 x 512", [(512, 512)]))
    cases.append(("decode 32 ragged", [(int(c), 1) for c in np.linspace(64, 2048, 32)]))
    cases.append(("256 chunk + 16 dec", [(1024, 256)] + [(1024, 1)] * 16))
    rows = []
    for label, seqs in cases:
        variants = {}
        for kind, make in (("paged", paged_binding), ("gqa", gqa_bindings)):
            for threads in (2, 1):
                sess = sessions[(kind, threads)]
                variants[(kind, threads)] = (sess, *make(sess, rng, L, seqs))
        times = {key: [] for key in variants}
        for _ in range(args.rounds):
            for key, (sess, bindings, _keep) in variants.items():
                time.sleep(0.25)  # let the previous session's spinning pool threads go idle
                times[key].append(time_block(sess, bindings, args.block_seconds) / L)
        med = {key: statistics.median(v) for key, v in times.items()}
        rows.append((label, sum(q for _, q in seqs), med))
        del variants

    print(
        f"\nPagedAttention vs GroupQueryAttention, {QWEN.heads} q heads / {QWEN.kv_heads} kv heads / head {QWEN.head_size}, "
        f"fp32, per layer, median of {args.rounds} interleaved rounds; {os.cpu_count()} CPUs, load average "
        f"{load_before:.1f} before / {os.getloadavg()[0]:.1f} after (other processes skew 2-thread runs most)"
    )
    head = (
        f"{'case':<19}{'tokens':>7}{'paged 2t ms':>13}{'gqa 2t ms':>11}{'paged us/tok':>14}{'gqa us/tok':>12}"
        f"{'gqa/paged':>11}{'paged 1t ms':>13}{'gqa 1t ms':>11}{'paged 1t/2t':>13}"
    )
    print(head)
    print("-" * len(head))
    for label, tokens, m in rows:
        p2, g2, p1, g1 = m[("paged", 2)], m[("gqa", 2)], m[("paged", 1)], m[("gqa", 1)]
        print(
            f"{label:<19}{tokens:>7}{p2 * 1e3:>13.3f}{g2 * 1e3:>11.3f}{p2 / tokens * 1e6:>14.2f}"
            f"{g2 / tokens * 1e6:>12.2f}{g2 / p2:>10.2f}x{p1 * 1e3:>13.3f}{g1 * 1e3:>11.3f}{p1 / p2:>12.2f}x"
        )
    by_label = {label: m for label, _, m in rows}
    ratio = lambda label: by_label[label][("gqa", 2)] / by_label[label][("paged", 2)]
    scaling = lambda label: by_label[label][("paged", 1)] / by_label[label][("paged", 2)]
    print("\nTargets (2 threads unless noted):")
    checks = [
        ("batch-1 decode no slower than GQA", min(ratio("decode  1 x 512"), ratio("decode  1 x 2048")), 1.0),
        ("prefill no slower than GQA", ratio("prefill 1 x 512"), 1.0),
        ("32-seq decode >= 1.5x faster per token", min(ratio("decode 32 x 512"), ratio("decode 32 x 2048")), 1.5),
        (
            "2 threads >= 1.7x faster than 1 at >= 8 seqs",
            min(scaling(f"decode {s:>2} x {c}") for s in (8, 32) for c in (512, 2048)),
            1.7,
        ),
    ]
    for name, value, target in checks:
        print(f"  {name:<48} worst {value:5.2f}x  (target {target}x)  {'ok' if value >= target else 'MISSED'}")


if __name__ == "__main__":
    main()
