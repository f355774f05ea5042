"""MatMulQ4 / MatMulQ5 / MatMulQ8 of two builds of the op library side by side: before and after a kernel change.

Build the other library as for bench_attention_builds.py and pass it as --before; --after defaults to
the installed build. Each case is one linear of SmolLM2-135M or the Qwen2.5-0.5B shape (the int8 LM
head of SmolLM2 too) at --rows rows (a decode step, 16 streams, prefill chunks), with 16-bit
activations (the default) or --activation-bits 8. Both builds' outputs are checked against the numpy
reference first. The builds alternate round by round (a machine shared with others drifts by 10-25 %
within minutes); medians of --rounds, microseconds per call, 2 threads.

    python benchmarks/bench_matmul_q_builds.py --before /tmp/old/libortserve_ops.so
    python benchmarks/bench_matmul_q_builds.py --step --before /tmp/old/libortserve_ops.so

A single linear stays in the CPU caches from call to call, which decode never has. --step times
instead one graph holding every 4-bit linear of a SmolLM2-135M decode step (30 layers of qkv, o,
gate_up and down: 66 MB of codes and scales, twice the L3 of the machines measured), one row, the
weights on huge pages as the engine keeps them: the rate at which decode's linears stream their
weights, beside the read bandwidth (benchmarks/membw.py) of the same minute.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_matmul_q import model
from bench_paged_attention import session
from onnx import TensorProto, helper, numpy_helper
from ortserve.export.qweight import QWeight
from ortserve.ops.matmul_q_reference import matmul_q
from runners.common import kernel_isa

from ortserve.engine.huge_pages import weights_on_huge_pages

CASES = {  # name: (bits, K, N)
    "SmolLM2 qkv": (4, 576, 960),
    "SmolLM2 gate_up": (4, 576, 3072),
    "SmolLM2 down": (4, 1536, 576),
    "SmolLM2 LM head (int8)": (8, 576, 49152),
    "Qwen shape gate_up": (4, 896, 9728),
    "Qwen shape down": (4, 4864, 896),
    "SmolLM2 gate_up, 5-bit": (5, 576, 3072),
}


def linear(bits: int, k: int, n: int, activation_bits: int, rng: np.random.Generator):
    d = rng.uniform(0.002, 0.01, (n, k // 32)).astype(np.float16).astype(np.float32)
    m = (-d * rng.uniform(1, (1 << bits) - 1, d.shape)).astype(np.float16).astype(np.float32)
    codes, scales = QWeight(rng.integers(0, 1 << bits, (n, k), dtype=np.uint8), d, m, bits).packed()
    node = helper.make_node(
        f"MatMulQ{bits}", ["x", "codes", "scales"], ["y"], domain="ortserve", N=n, K=k, activation_bits=activation_bits
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", k])
    inits = [numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(scales, "scales")]
    return model([node], [x], inits), codes, scales


STEP_LINEARS = ((576, 960), (576, 576), (576, 3072), (1536, 576))  # SmolLM2-135M: qkv, o, gate_up, down
STEP_LAYERS = 30


def decode_step(activation_bits: int, rng: np.random.Generator):
    """Every 4-bit linear of a SmolLM2-135M decode step in one graph (inputs x576 and x1536, one
    output per linear), its numpy references for one row of x, and the weights' bytes."""
    nodes, inits, outputs, refs, nbytes = [], [], [], [], 0
    feed = {f"x{k}": rng.normal(size=(1, k)).astype(np.float32) for k in (576, 1536)}
    for layer in range(STEP_LAYERS):
        for j, (k, n) in enumerate(STEP_LINEARS):
            _, codes, scales = linear(4, k, n, activation_bits, rng)
            name = f"{layer}_{j}"
            inits += [numpy_helper.from_array(codes, f"codes{name}"), numpy_helper.from_array(scales, f"scales{name}")]
            nodes.append(
                helper.make_node(
                    "MatMulQ4",
                    [f"x{k}", f"codes{name}", f"scales{name}"],
                    [f"y{name}"],
                    domain="ortserve",
                    N=n,
                    K=k,
                    activation_bits=activation_bits,
                )
            )
            outputs.append(helper.make_tensor_value_info(f"y{name}", TensorProto.FLOAT, [1, n]))
            refs.append(matmul_q(feed[f"x{k}"], codes, scales, n))
            nbytes += codes.nbytes + scales.nbytes
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, x.shape[1]]) for name, x in feed.items()]
    graph = helper.make_graph(nodes, "step", inputs, outputs, inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("ortserve", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10), feed, refs, nbytes


def time_step(args: argparse.Namespace, rng: np.random.Generator) -> None:
    import membw

    model_proto, feed, refs, nbytes = decode_step(args.activation_bits, rng)
    builds = {}
    for key, lib in (("before", args.before), ("after", args.after)):
        with weights_on_huge_pages():
            builds[key] = session(model_proto, 2, lib)
        for y, reference in zip(builds[key].run(None, feed), refs):
            assert np.abs(y - reference).max() <= 0.05 * np.abs(reference).max(), f"{key} build is wrong"
    times: dict[str, list[float]] = {key: [] for key in builds}
    for _ in range(args.rounds):
        for key, sess in builds.items():
            time.sleep(0.05)  # the other session's pool threads stop spinning
            sess.run(None, feed)
            for _ in range(15):
                start = time.perf_counter()
                sess.run(None, feed)
                times[key].append(time.perf_counter() - start)
    read = membw.measure(2.0, [2], 3)["threads"]["2"]["read_GBps"]
    print(f"ISA: {kernel_isa()}, 2 threads, {args.activation_bits}-bit activations, {nbytes / 1e6:.1f} MB a step")
    print(f"membw.py read (2 threads) after the runs: {read:.1f} GB/s")
    print("| build | ms a step (median) | GB/s | fast end (10th percentile) ms | GB/s |")
    print("|---|---:|---:|---:|---:|")
    for key, t in times.items():
        median, fast = statistics.median(t), float(np.percentile(t, 10))
        print(
            f"| {key} | {median * 1e3:.3f} | {nbytes / median / 1e9:.1f} | {fast * 1e3:.3f} | {nbytes / fast / 1e9:.1f} |"
        )


def time_runs(sess, x: np.ndarray, seconds: float) -> float:
    """Median seconds per call over calls lasting about `seconds`, after one untimed call."""
    sess.run(None, {"x": x})
    times, end = [], time.perf_counter() + seconds
    while time.perf_counter() < end or len(times) < 3:
        start = time.perf_counter()
        sess.run(None, {"x": x})
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the op library to compare against")
    parser.add_argument("--after", default=None, help="default: the installed build")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64, 512])
    parser.add_argument("--activation-bits", type=int, choices=(8, 16), default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.1, help="timed calls per build per round")
    parser.add_argument("--step", action="store_true", help="a whole decode step's linears instead (see above)")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    if args.step:
        return time_step(args, rng)
    print(f"ISA: {kernel_isa()}, 2 threads, {args.activation_bits}-bit activations, median of {args.rounds} rounds")
    print("| linear | K x N | rows | before us | after us | after G MAC/s | before / after |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, (bits, k, n) in CASES.items():
        graph, codes, scales = linear(bits, k, n, args.activation_bits, rng)
        builds = {key: session(graph, 2, lib) for key, lib in (("before", args.before), ("after", args.after))}
        for rows in args.rows:
            x = rng.normal(size=(rows, k)).astype(np.float32)
            reference = matmul_q(x, codes, scales, n)
            for key, sess in builds.items():
                y = sess.run(None, {"x": x})[0]
                assert np.abs(y - reference).max() <= 0.05 * np.abs(reference).max(), f"{key} build is wrong"
            times: dict[str, list[float]] = {key: [] for key in builds}
            for _ in range(args.rounds):
                for key, sess in builds.items():
                    time.sleep(0.05)  # the other session's pool threads stop spinning
                    times[key].append(time_runs(sess, x, args.block_seconds))
            before, after = (statistics.median(times[key]) for key in ("before", "after"))
            print(
                f"| {name} | {k} x {n} | {rows} | {before * 1e6:,.0f} | {after * 1e6:,.0f} "
                f"| {rows * k * n / after / 1e9:.1f} | {before / after:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
