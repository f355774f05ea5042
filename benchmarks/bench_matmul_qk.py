"""One GGUF Q4_K or Q5_K linear, ortserve.MatMulQ4K / Q5K (its sub-scales and mins as bytes beside the codes, fp16 d
and dmin per 256 columns: 4.625 / 5.625 bits a weight) against what held the same weight before op_version 12:
MatMulQ4 / Q5 with each block's d * sc and -dmin * mn in fp32 (6 / 7 bits a weight). Same codes, same answers
(tests/ops/test_matmul_qk.py checks them bit for bit), in one process, in alternating rounds of runs. Shapes are
Llama-3.2-1B's linears (widths multiples of 256, so llama-quantize's Q4_K_M makes them Q4_K); rows are a decode
step (1), batched decodes (4, 16) and prefill chunks (64, 512). Times are medians over --iters runs, microseconds.

    python benchmarks/bench_matmul_qk.py --threads 2
    python benchmarks/bench_matmul_qk.py --bits 5 --rows 1 512 --shapes 2048x2048
"""

from __future__ import annotations

import argparse

import numpy as np
from bench_matmul_q import median_times, model, session
from onnx import TensorProto, helper, numpy_helper
from ortserve.ops.matmul_q_reference import pack_q, pack_qk, unpack_q
from runners.common import kernel_isa

import ortserve.ops

SHAPES = {"qkv": (2048, 3072), "o": (2048, 2048), "gate_up": (2048, 16384), "down": (8192, 2048)}


def linear_session(op: str, codes: np.ndarray, scales: np.ndarray, k: int, n: int, threads: int):
    node = helper.make_node(op, ["x", "codes", "scales"], ["y"], domain="ortserve", N=n, K=k)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["T", k])
    inits = [numpy_helper.from_array(codes, "codes"), numpy_helper.from_array(scales, "scales")]
    return session(model([node], [x], inits), threads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bits", type=int, choices=(4, 5), default=4)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 512])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), help="names or KxN")
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    b = args.bits
    print(f"ISA: {kernel_isa()}, threads {args.threads}, kernel build: {ortserve.ops.library_path()}")
    print(
        f"| shape K x N | rows | MatMulQ{b}K MB | MatMulQ{b}K us | MatMulQ{b}, fp32 d and m, MB | its us | speed-up |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.shapes:
        k, n = SHAPES[name] if name in SHAPES else map(int, name.split("x"))
        codes = rng.integers(0, 1 << b, (n, k), dtype=np.uint8)
        sub, mins = (rng.integers(0, 64, (n, k // 32), dtype=np.uint8) for _ in range(2))
        d, dmin = (rng.uniform(1e-4, 1e-3, (n, k // 256)).astype(np.float16).astype(np.float32) for _ in range(2))
        k_weight = pack_qk(codes, sub, mins, d, dmin, b)
        block_weight = pack_q(*unpack_q(*k_weight, n, k), b, np.float32)
        sessions = {
            "k": linear_session(f"MatMulQ{b}K", *k_weight, k, n, args.threads),
            "blocks": linear_session(f"MatMulQ{b}", *block_weight, k, n, args.threads),
        }
        megabytes = {key: sum(a.nbytes for a in w) / 1e6 for key, w in (("k", k_weight), ("blocks", block_weight))}
        for rows in args.rows:
            x = rng.normal(size=(rows, k)).astype(np.float32)
            answers = [s.run(None, {"x": x})[0] for s in sessions.values()]  # warm-up, and the same answer
            assert np.array_equal(*answers)
            ours, before = median_times(sessions, x, args.iters).values()
            print(
                f"| {name} {k}x{n} | {rows} | {megabytes['k']:.1f} | {ours:,.1f} | {megabytes['blocks']:.1f} "
                f"| {before:,.1f} | {before / ours:.2f}x |"
            )


if __name__ == "__main__":
    main()
