"""The fp32 linears of one step, ortserve.MatMulF against onnxruntime's MatMul (what fp32 artifacts used
before it: W as [in, out], prepacked by MLAS when the session is built), on the same random weights.

One graph per kind holds every linear of the model, as a step runs them: each layer's qkv, o,
gate_up and down, then the LM head, SmolLM2-135M's shapes (or the Qwen2.5-0.5B shape's). Both
sessions are built as the engine builds its own (weights collapsed into huge pages) and run in one
process, in alternating rounds. Rows are a decode step (1), batched decode (4, 16) and prefill
chunks (64, 512). Per call: the median over --iters runs of the best round, in ms, and the weights'
bytes over that time.

    python benchmarks/bench_matmul_f.py                       # SmolLM2-135M, 2 threads
    python benchmarks/bench_matmul_f.py --model qwen2.5-0.5b-shape --rows 1 16
    python benchmarks/bench_matmul_f.py --as-matmul ARTIFACT OUT   # ARTIFACT's graph with MatMul instead
    python benchmarks/bench_matmul_f.py --model qwen2.5-0.5b-shape --interleave-membw 25
    python benchmarks/bench_matmul_f.py --before /tmp/old/libortserve_ops.so   # and a build before a change
    python benchmarks/bench_matmul_f.py --per-shape 8         # a call's fixed cost beside its bytes' time

--interleave-membw N: the decode linears' share of the read bandwidth, measured in the same minute. N
rounds, each the one-row call (median of 12 runs) and then membw.py's read and read4 (2 threads, 2 GiB,
best of 3); the share is the call's bytes per second over read4's, round by round. On a shared host the
bandwidth moves by 1.5x within minutes, so a share of a decode run and a bandwidth measured minutes
apart says more about the host than the kernel; side by side, the two see the same neighbours.

--per-shape N: where a decode call's time goes beyond its bytes. One graph per distinct shape of the
model's linears, as many copies of it as fill about 540 MB (so every call reads from memory), timed in
one-row calls; N rounds, each with membw.py's 2-thread read before and after it. Per round, a line
through the layer shapes' (bytes, time a call) points, fitted in relative error (the LM head's one
large call left out: its noise would set the line), gives the rate the bytes stream at and the fixed
cost of a call (the intercept): the part a step of 120 small calls pays 120 times.

--as-matmul writes the baseline of a whole-graph comparison (bench_graph.py --artifact ...): the same
artifact, its MatMulF nodes rewritten as MatMul(x, Transpose(W)) (+ Add bias), which onnxruntime
folds into the prepacked MatMul that fp32 artifacts had before; the weight files are hard links.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import membw
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from runners.common import kernel_isa

import ortserve.ops
from ortserve.engine.huge_pages import weights_on_huge_pages

# hidden, intermediate, layers, vocabulary, kv width (kv heads x head size)
MODELS = {"smollm2-135m": (576, 1536, 30, 49152, 192), "qwen2.5-0.5b-shape": (896, 4864, 24, 151936, 128)}


def linears(model: str) -> list[tuple[int, int]]:
    """(K, N) of every linear a step runs, in order."""
    hidden, inter, layers, vocab, kv = MODELS[model]
    layer = [(hidden, hidden + 2 * kv), (hidden, hidden), (hidden, 2 * inter), (inter, hidden)]
    return layer * layers + [(hidden, vocab)]


def build(
    shapes: list[tuple[int, int]], weights: list[np.ndarray], ours: bool, threads: int, library: str | None = None
) -> ort.InferenceSession:
    """Each linear reads the graph input of its width ("x576", ...); every result is an output. library: a
    build of the op library (default: the installed one)."""
    widths = sorted({k for k, _ in shapes})
    nodes, inits, outputs = [], [], []
    for i, ((k, n), w) in enumerate(zip(shapes, weights)):
        if ours:  # MatMulF: W [N, K], as the checkpoint stores it
            inits.append(numpy_helper.from_array(w, f"w{i}"))
            nodes.append(helper.make_node("MatMulF", [f"x{k}", f"w{i}"], [f"y{i}"], domain=ortserve.ops.DOMAIN))
        else:  # MatMul: W [K, N]
            inits.append(numpy_helper.from_array(np.ascontiguousarray(w.T), f"w{i}"))
            nodes.append(helper.make_node("MatMul", [f"x{k}", f"w{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["T", n]))
    inputs = [helper.make_tensor_value_info(f"x{k}", TensorProto.FLOAT, ["T", k]) for k in widths]
    graph = helper.make_graph(nodes, "linears", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid(ortserve.ops.DOMAIN, ortserve.ops.OPSET_VERSION)]
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(library or ortserve.ops.library_path())
    proto = helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()
    with weights_on_huge_pages():
        return ort.InferenceSession(proto, options, providers=["CPUExecutionProvider"])


def as_matmul(artifact: Path, out: Path) -> None:
    import onnx

    from ortserve.artifact import MODEL_FILE

    model = onnx.load(str(artifact / MODEL_FILE), load_external_data=False)
    nodes = []
    for node in model.graph.node:
        if node.op_type != "MatMulF":
            nodes.append(node)
            continue
        x, w, *bias = node.input
        if len(bias) > 1 or any(a.name in ("gated", "norm_epsilon") for a in node.attribute):
            raise SystemExit(
                f"{node.name} runs an input stage (op_version 9): export the artifact with fold_inputs=False"
            )
        y = node.output[0]
        nodes.append(helper.make_node("Transpose", [w], [f"{y}.wT"], name=f"{node.name}.transpose"))
        nodes.append(helper.make_node("MatMul", [x, f"{y}.wT"], [f"{y}.mm" if bias else y], name=node.name))
        if bias:
            nodes.append(helper.make_node("Add", [f"{y}.mm", bias[0]], [y], name=f"{node.name}.bias"))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    out.mkdir(parents=True, exist_ok=True)
    for file in artifact.iterdir():
        if file.is_file() and file.name != MODEL_FILE and not (out / file.name).exists():
            os.link(file, out / file.name)
    onnx.save_model(model, str(out / MODEL_FILE))
    print(f"{out}: {sum(n.op_type == 'MatMul' for n in nodes)} MatMul nodes")


def interleave_membw(session: ort.InferenceSession, shapes: list[tuple[int, int]], nbytes: int, rounds: int) -> None:
    """One-row calls and membw.py's read bandwidth in alternation: the call's share of read4, per round."""
    rng = np.random.default_rng(1)
    feed = {f"x{k}": rng.standard_normal((1, k), dtype=np.float32) for k in sorted({k for k, _ in shapes})}
    session.run(None, feed)
    print("| round | MatMulF GB/s (median of 12) | membw read GB/s | membw read4 GB/s | share of read4 |")
    print("|---:|---:|---:|---:|---:|")
    shares = []
    for r in range(rounds):
        times = []
        for _ in range(12):
            start = time.perf_counter()
            session.run(None, feed)
            times.append(time.perf_counter() - start)
        ours = nbytes / statistics.median(times) / 1e9
        bw = membw.measure(2.0, [2], 3)["threads"]["2"]
        shares.append(ours / bw["read4_GBps"])
        print(f"| {r} | {ours:.1f} | {bw['read_GBps']:.1f} | {bw['read4_GBps']:.1f} | {shares[-1]:.2f} |", flush=True)
    q = statistics.quantiles(shares, n=4)
    print(f"\nshare of read4: median {statistics.median(shares):.2f}, quartiles {q[0]:.2f}-{q[2]:.2f}, {rounds} rounds")


def per_shape(model: str, threads: int, rounds: int) -> None:
    """One-row calls of each distinct shape, a graph of ~540 MB of copies each, beside membw.py's read."""
    rng = np.random.default_rng(0)
    graphs = {}
    for k, n in dict.fromkeys(linears(model)):
        copies = max(1, int(540e6 // (4 * k * n)))
        weights = [rng.standard_normal((n, k), dtype=np.float32) * 0.05 for _ in range(copies)]
        graphs[(k, n)] = (build([(k, n)] * copies, weights, True, threads), copies, 4 * k * n)
    print(f"{model} fp32 linears, one-row MatMulF calls, {threads} threads, {kernel_isa()}")
    head = " | ".join(f"{k} x {n}: us a call (GB/s)" for k, n in graphs)
    print(f"| round | read GB/s before / after | {head} | layers' line: GB/s | us a call |")
    print("|---:|---:|" + "---:|" * len(graphs) + "---:|---:|")
    for r in range(rounds):
        before = membw.measure(0.5, [threads], 3)["threads"][str(threads)]["read_GBps"]
        cells, xs, ys = [], [], []
        for (k, _), (session, copies, nbytes) in graphs.items():
            feed = {f"x{k}": rng.standard_normal((1, k), dtype=np.float32)}
            session.run(None, feed)
            times = []
            for _ in range(7):
                start = time.perf_counter()
                session.run(None, feed)
                times.append(time.perf_counter() - start)
            call = statistics.median(times) / copies
            cells.append(f"{call * 1e6:,.1f} ({nbytes / call / 1e9:.1f})")
            xs.append(nbytes)
            ys.append(call)
        after = membw.measure(0.5, [threads], 3)["threads"][str(threads)]["read_GBps"]
        layer = np.argsort(xs)[:-1]  # all but the largest call (the LM head)
        slope, intercept = np.polyfit(np.array(xs)[layer], np.array(ys)[layer], 1, w=1 / np.array(ys)[layer])
        print(
            f"| {r} | {before:.1f} / {after:.1f} | {' | '.join(cells)} | {1 / slope / 1e9:.1f} | {intercept * 1e6:.1f} |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="smollm2-135m")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 512])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--as-matmul", type=Path, nargs=2, metavar=("ARTIFACT", "OUT"))
    parser.add_argument("--interleave-membw", type=int, metavar="ROUNDS", help="one-row calls beside membw.py")
    parser.add_argument("--before", metavar="LIBRARY", help="also time MatMulF of this build of the op library")
    parser.add_argument("--per-shape", type=int, metavar="ROUNDS", help="a call's fixed cost, shape by shape")
    args = parser.parse_args()
    if args.as_matmul:
        return as_matmul(*args.as_matmul)
    if args.per_shape:
        return per_shape(args.model, args.threads, args.per_shape)
    shapes = linears(args.model)
    rng = np.random.default_rng(0)
    weights = [(rng.standard_normal((n, k), dtype=np.float32) * 0.05) for k, n in shapes]
    nbytes = sum(w.nbytes for w in weights)
    if args.interleave_membw:
        print(f"{args.model} fp32 linears ({nbytes / 1e6:,.0f} MB), MatMulF, {args.threads} threads, {kernel_isa()}")
        return interleave_membw(build(shapes, weights, True, args.threads), shapes, nbytes, args.interleave_membw)
    sessions = {
        "MatMul": build(shapes, weights, False, args.threads),
        "MatMulF": build(shapes, weights, True, args.threads),
    }
    if args.before:
        sessions["before"] = build(shapes, weights, True, args.threads, args.before)
    code = "AVX2 code" if os.environ.get("ORTSERVE_KERNEL_ISA") == "avx2" else "its own code"
    print(f"{args.model} fp32 linears ({nbytes / 1e6:,.0f} MB), {args.threads} threads, {kernel_isa()} CPU, {code}")
    before = " | MatMulF before ms | speed / before" if args.before else ""
    print(f"| rows | MatMul ms | MatMulF ms | MatMul GB/s | MatMulF GB/s | MatMulF / MatMul speed{before} |")
    print("|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if args.before else ""))
    for rows in args.rows:
        feed = {f"x{k}": rng.standard_normal((rows, k), dtype=np.float32) for k in sorted({k for k, _ in shapes})}
        first = {name: s.run(None, feed) for name, s in sessions.items()}  # warm-up, and the results agree
        for name in sessions.keys() - {"MatMul"}:
            for a, b in zip(first["MatMul"], first[name]):
                np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-3)
        best = {name: float("inf") for name in sessions}
        iters = args.iters if rows <= 64 else max(2, args.iters // 4)
        for _ in range(args.rounds):
            for name, s in sessions.items():
                times = []
                for _ in range(iters):
                    start = time.perf_counter()
                    s.run(None, feed)
                    times.append(time.perf_counter() - start)
                best[name] = min(best[name], statistics.median(times))
        base, ours = best["MatMul"], best["MatMulF"]
        old = f" {best['before'] * 1e3:.2f} | {best['before'] / ours:.2f} |" if args.before else ""
        print(
            f"| {rows} | {base * 1e3:.2f} | {ours * 1e3:.2f} | {nbytes / base / 1e9:.1f} | {nbytes / ours / 1e9:.1f} "
            f"| {base / ours:.2f} |{old}",
            flush=True,
        )


if __name__ == "__main__":
    main()
