"""Decode steps of one checkpoint exported twice: its norms and gated activations as nodes of their own
(``fold_inputs=False``) and inside the linears (the default since op_version 9, export/linear_inputs.py).

Both sessions live in one process with the engine's thread settings (2 pinned threads that spin, and
stop spinning when a run ends so the other session gets the cores); their decode steps alternate one
by one, so the host's drift meets both alike. Reported: each variant's median step and the median of
the per-pair time ratios (unfolded / folded; > 1: folding is faster), with its quartiles.

    python benchmarks/bench_fold.py --model smollm2-135m --precision int4 --steps 1500
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import onnx
import onnxruntime as ort
from ortserve.export import export_model
from ortserve.export.validate import PagedRunner
from runners.common import RESULTS, kernel_isa, load_model


def options() -> ort.SessionOptions:
    """The engine's session options for 2 pinned cores (model_runner.session_options, op library
    registered by PagedRunner), stopping spinning after each run as a draft model's session does."""
    o = ort.SessionOptions()
    o.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    o.intra_op_num_threads, o.inter_op_num_threads, o.enable_mem_pattern = 2, 1, False
    o.add_session_config_entry("session.intra_op_thread_affinities", "2")
    o.add_session_config_entry("session.intra_op.allow_spinning", "1")
    o.add_session_config_entry("session.force_spinning_stop", "1")
    return o


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--precision", default="int4")
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--context", type=int, default=128)
    args = p.parse_args()
    ort.set_default_logger_severity(3)
    model = load_model(args.model)
    arts = []
    for fold in (False, True):
        out = RESULTS / "artifacts" / f"{args.model}-{args.precision}-fold-{str(fold).lower()}"
        if not (out / "ortserve.json").is_file():
            export_model(model.hf_dir, out, precision=args.precision, progress=False, fold_inputs=fold)
        arts.append(out)
    os.sched_setaffinity(0, {0})  # the calling thread is the pool's thread 0, on core 0; thread 1 on core 1
    runners = [PagedRunner(a, num_blocks=-(-(args.context + 512) // 16) + 2, options=options()) for a in arts]
    nodes = [len(onnx.load(a / "model.onnx", load_external_data=False).graph.node) for a in arts]
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 1000, args.context).tolist()
    for r in runners:
        r.step([(0, prompt)])
    times: list[list[float]] = [[], []]
    for i in range(args.steps):
        if runners[0].sequences[0].num_tokens >= args.context + 512:  # keep the context bounded
            for r in runners:
                r.release(0)
                r.step([(0, prompt)])
        for j in (0, 1) if i % 2 == 0 else (1, 0):
            started = time.perf_counter()
            runners[j].step([(0, [5])])
            times[j].append(time.perf_counter() - started)
    unfolded, folded = np.array(times[0]), np.array(times[1])
    ratio = unfolded / folded
    print(f"{args.model} {args.precision}, {kernel_isa()}, 2 threads, {args.steps} decode steps each, interleaved")
    print("| graph | nodes | median step ms | p10 ms |\n|---|---:|---:|---:|")
    names = ("norms and gated activation as nodes", "folded into the linears")
    for name, count, t in zip(names, nodes, (unfolded, folded)):
        print(f"| {name} | {count} | {np.median(t) * 1e3:.3f} | {np.percentile(t, 10) * 1e3:.3f} |")
    print(
        f"unfolded / folded step time, per pair: median {np.median(ratio):.3f}, "
        f"quartiles {np.percentile(ratio, 25):.3f}-{np.percentile(ratio, 75):.3f}"
    )


if __name__ == "__main__":
    main()
