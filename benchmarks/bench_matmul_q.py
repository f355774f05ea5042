"""One 4-bit linear, ortserve.MatMulQ4 against what int4 artifacts used before it: MatMulNBits (4 bits,
block 32, integer zero points, accuracy level 4) followed by AddBlockOffsets (fp16 float block
minimums, as Q4_1 codes need), on the same codes, in one process, in alternating rounds of runs (a session's idle pool threads spin for
a while after each run and would slow the other session's next one).
MatMulQ4 runs with 8-bit and with 16-bit activations (int8 + an int8 residual). Shapes are SmolLM2-135M's linears; rows are a decode step (1), a batched decode (4, 16) and prefill
chunks (64, 512). Times are medians over --iters runs of each session, in microseconds.

    python benchmarks/bench_matmul_q.py --threads 2
    python benchmarks/bench_matmul_q.py --threads 1 --rows 1 16 --shapes 576x1536
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
from ortserve.export.nbits import pack
from ortserve.export.qweight import QWeight
from ortserve.ops.matmul_q_reference import matmul_q
from runners.common import kernel_isa

import ortserve.ops

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}


def model(nodes, inputs, initializers):
    graph = helper.make_graph(
        nodes, "bench", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["T", "N"])], initializers
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("ortserve", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def session(m, threads: int) -> ort.InferenceSession:
    o = ort.SessionOptions()
    o.intra_op_num_threads = threads
    ortserve.ops.register(o)
    return ort.InferenceSession(m.SerializeToString(), o, providers=["CPUExecutionProvider"])


def median_times(sessions: dict[str, ort.InferenceSession], x: np.ndarray, iters: int) -> dict[str, float]:
    """Each session's median run time on x, microseconds: 5 rounds of runs of one session after the other
    (a session's idle pool threads spin for a while after each run and would slow the other's next one)."""
    times: dict[str, list[float]] = {key: [] for key in sessions}
    runs = max(3, iters * 16 // max(x.shape[0], 16) // 5)
    for _ in range(5):
        for key, s in sessions.items():
            time.sleep(0.05)
            for _ in range(runs):
                start = time.perf_counter()
                s.run(None, {"x": x})
                times[key].append(time.perf_counter() - start)
    return {key: statistics.median(t) * 1e6 for key, t in times.items()}


def q4_session(w: QWeight, k: int, n: int, threads: int, activation_bits: int = 8) -> ort.InferenceSession:
    codes, scales = w.packed()
    node = helper.make_node(
        "MatMulQ4", ["x", "codes", "scales"], ["y"], domain="ortserve", N=n, K=k, activation_bits=activation_bits
    )
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", k])
    inits = [numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(scales, "scales")]
    return session(model([node], [x], inits), threads)


def nbits_session(w: QWeight, k: int, n: int, threads: int) -> ort.InferenceSession:
    """The same weights as MatMulNBits codes with centred zero points z and offsets m + d * z."""
    z = np.clip(np.rint(-w.m / w.d), 0, 15).astype(np.uint8)
    offsets = (w.m + w.d * z).astype(np.float16)
    k_blocks = k // 32
    qweight = pack(w.codes.reshape(n, k_blocks, 32), 4)
    zero_points = pack(z, 4)
    matmul = helper.make_node(
        "MatMulNBits",
        ["x", "qweight", "scales", "zero_points"],
        ["y0"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=32,
        accuracy_level=4,
    )
    add = helper.make_node("AddBlockOffsets", ["x", "y0", "offsets"], ["y"], domain="ortserve", block_size=32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", k])
    inits = [
        numpy_helper.from_array(qweight, "qweight"),
        numpy_helper.from_array(w.d.astype(np.float32), "scales"),
        numpy_helper.from_array(zero_points, "zero_points"),
        numpy_helper.from_array(np.ascontiguousarray(offsets.T), "offsets"),
    ]
    return session(model([matmul, add], [x], inits), threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 512])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="names or KxN")
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"ISA: {kernel_isa()}, threads {args.threads}, kernel build: {ortserve.ops.library_path()}")
    print(
        "| shape K x N | rows | MatMulQ4 us | MatMulQ4, 16-bit activations us | MatMulNBits + AddBlockOffsets us | speed-up (8-bit) |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name in args.shapes:
        k, n = SHAPES[name] if name in SHAPES else map(int, name.split("x"))
        d = rng.uniform(0.002, 0.01, (n, k // 32)).astype(np.float16).astype(np.float32)
        m = (-d * rng.uniform(6, 9, d.shape)).astype(np.float16).astype(np.float32)
        w = QWeight(rng.integers(0, 16, (n, k), dtype=np.uint8), d, m, 4)
        sessions = {
            "q4": q4_session(w, k, n, args.threads),
            "q4-16": q4_session(w, k, n, args.threads, 16),
            "nbits": nbits_session(w, k, n, args.threads),
        }
        for rows in args.rows:
            x = rng.normal(size=(rows, k)).astype(np.float32)
            reference = matmul_q(x, *w.packed(), n)
            for key, s in sessions.items():  # warm-up, and a check that both compute the same
                y = s.run(None, {"x": x})[0]
                assert np.abs(y - reference).max() <= 0.05 * np.abs(reference).max(), key
            q4, q4_16, nbits = median_times(sessions, x, args.iters).values()
            print(f"| {name} {k}x{n} | {rows} | {q4:,.1f} | {q4_16:,.1f} | {nbits:,.1f} | {nbits / q4:.2f}x |")


if __name__ == "__main__":
    main()
