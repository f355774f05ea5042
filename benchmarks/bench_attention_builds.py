"""PagedAttention of two builds of the op library side by side: before and after a kernel change.

Build the other library from another commit (e.g. `git worktree add /tmp/old <commit>` and
`pip wheel --no-deps /tmp/old`, then unzip its ortserve/ops/libortserve_ops.so), and pass it as
--before; --after defaults to the installed build. Cases are an attention layer's steps that differ
in query rows: one 512-token prompt, speculative verification steps (5 and 8 rows at context 400),
a decode (1 row, context 200) and 16 decodes (context 300), on SmolLM2-135M's heads (9 / 3) and the
Qwen2.5-0.5B shape's (14 / 2). The builds alternate round by round (a machine shared with others
drifts by 10-25 % within minutes); medians of --rounds, per layer, 2 threads.

    python benchmarks/bench_attention_builds.py --before /tmp/old/libortserve_ops.so
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from bench_paged_attention import QWEN, SMOLLM2, paged_binding, paged_model, session, time_block
from runners.common import kernel_isa

CASES = {
    "prompt 512": [(512, 512)],
    "verify 8 @ 400": [(400, 8)],
    "verify 5 @ 400": [(400, 5)],
    "decode 1 @ 200": [(200, 1)],
    "16 decodes @ 300": [(300, 1)] * 16,
}


def multiply_adds(shape, seqs) -> int:
    """Of q.k and p.v for every visible (query, key) pair: 2 x heads x head_size each."""
    pairs = sum(ctx - q + i + 1 for ctx, q in seqs for i in range(q))
    return 2 * shape.heads * shape.head_size * pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the op library to compare against")
    parser.add_argument("--after", default=None, help="default: the installed build")
    parser.add_argument("--layers", type=int, default=4, help="attention nodes per model (own cache each)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-seconds", type=float, default=0.2, help="timed runs per build per round")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print(f"ISA: {kernel_isa()}, 2 threads, {args.layers} layers, median of {args.rounds} alternating rounds")
    print("| heads (q / kv) | case | before us | after us | after G MAC/s | before / after |")
    print("|---|---|---:|---:|---:|---:|")
    for name, shape in (("SmolLM2", SMOLLM2), ("Qwen shape", QWEN)):
        builds = {
            key: session(paged_model(args.layers, shape), 2, lib)
            for key, lib in (("before", args.before), ("after", args.after))
        }
        for label, seqs in CASES.items():
            bound = {key: paged_binding(s, rng, args.layers, seqs, shape) for key, s in builds.items()}
            times: dict[str, list[float]] = {key: [] for key in builds}
            for _ in range(args.rounds):
                for key, s in builds.items():
                    time.sleep(0.1)  # the other session's pool threads stop spinning
                    times[key].append(time_block(s, bound[key][0], args.block_seconds) / args.layers)
            before, after = (statistics.median(times[key]) for key in ("before", "after"))
            rate = multiply_adds(shape, seqs) / after / 1e9
            print(
                f"| {name} ({shape.heads} / {shape.kv_heads}) | {label} | {before * 1e6:,.1f} | {after * 1e6:,.1f} "
                f"| {rate:.1f} | {before / after:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
