"""Offline throughput of the engine, as vLLM's benchmark_throughput measures it.

64 prompts of exactly 128 random token ids, 128 output tokens each (ignore_eos), all submitted
at once; output tokens/s over the wall time from submission to the last token. One run per
(precision, max-num-seqs). Per step it also times what happens outside ``session.run``: the
engine's Python (schedule, input preparation, sampling, update) and the output processor
(detokenisation), and reports them as a share of the step time, overall and in decode-only steps.

    python benchmarks/bench_offline.py                       # fp32 and int4, max-num-seqs 1 8 32
    python benchmarks/bench_offline.py --precisions fp32 --max-num-seqs 32 --num-prompts 32
    python benchmarks/bench_offline.py --defaults --precisions fp32 --block-sizes 8 16 32 \
        --max-num-seqs 1 8 16 32 64                          # the numbers in engine/config.py

Results go to stdout and, as JSON, to benchmarks/results/bench_offline-<time>.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np


@dataclass
class RunResult:
    precision: str
    max_num_seqs: int
    block_size: int
    max_num_batched_tokens: int
    num_prompts: int
    input_len: int
    output_len: int
    wall_seconds: float
    output_tokens_per_s: float
    total_tokens_per_s: float
    num_steps: int
    mean_step_ms: float
    python_ms_per_step: float  # engine step minus session.run
    python_share: float  # of step time
    detok_ms_per_step: float  # output processor, outside the engine
    decode_steps: int
    decode_step_ms: float
    decode_python_ms: float
    decode_python_share: float
    decode_python_share_with_detok: float


def run_one(
    artifact: Path, precision: str, max_num_seqs: int, block_size: int, budget: int, args: argparse.Namespace
) -> RunResult:
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.core import EngineCore
    from ortserve.engine.ipc import EngineRequest
    from ortserve.engine.output_processor import OutputProcessor
    from ortserve.sampling_params import SamplingParams
    from ortserve.tokenizer import load_tokenizer

    engine = EngineCore(
        EngineConfig(
            model=str(artifact),
            max_num_seqs=max_num_seqs,
            block_size=block_size,
            max_num_batched_tokens=budget,
            kv_cache_space=args.kv_cache_space,
            threads_bind=args.threads_bind,
        )
    )
    tokenizer = load_tokenizer(engine.tokenizer_dir)
    processor = OutputProcessor(tokenizer)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=args.temperature, top_p=1.0, max_tokens=args.output_len, ignore_eos=True)
    runner = engine.runner
    steps = []  # (tokens in step, all decode?, step seconds, session seconds, detok seconds)
    started = time.perf_counter()
    for i in range(args.num_prompts):
        ids = rng.integers(100, engine.manifest.vocab_size - 100, size=args.input_len).tolist()
        engine.add_request(EngineRequest(f"b{i}", ids, params))
        processor.add_request(f"b{i}", ids, params)
    while processor.has_unfinished_requests():
        batch_decode = (
            all(s.num_computed_tokens == s.num_tokens - 1 for s in engine.scheduler.running)
            and not engine.scheduler.waiting
        )
        model_before = runner.model_seconds
        t0 = time.perf_counter()
        outputs = engine.step()
        t1 = time.perf_counter()
        processor.process_outputs(outputs)
        t2 = time.perf_counter()
        steps.append((len(outputs), batch_decode, t1 - t0, runner.model_seconds - model_before, t2 - t1))
    wall = time.perf_counter() - started
    out_tokens = args.num_prompts * args.output_len
    step_s = np.array([s[2] for s in steps])
    model_s = np.array([s[3] for s in steps])
    detok_s = np.array([s[4] for s in steps])
    decode = np.array([s[1] for s in steps])
    full = decode & (np.array([s[0] for s in steps]) == max_num_seqs)  # decode steps at the cap
    pick = full if full.any() else decode
    python = step_s - model_s
    result = RunResult(
        precision=precision,
        max_num_seqs=max_num_seqs,
        block_size=block_size,
        max_num_batched_tokens=budget,
        num_prompts=args.num_prompts,
        input_len=args.input_len,
        output_len=args.output_len,
        wall_seconds=wall,
        output_tokens_per_s=out_tokens / wall,
        total_tokens_per_s=(out_tokens + args.num_prompts * args.input_len) / wall,
        num_steps=len(steps),
        mean_step_ms=1e3 * step_s.mean(),
        python_ms_per_step=1e3 * python.mean(),
        python_share=python.sum() / step_s.sum(),
        detok_ms_per_step=1e3 * detok_s.mean(),
        decode_steps=int(pick.sum()),
        decode_step_ms=1e3 * step_s[pick].mean(),
        decode_python_ms=1e3 * python[pick].mean(),
        decode_python_share=python[pick].sum() / step_s[pick].sum(),
        decode_python_share_with_detok=(python[pick].sum() + detok_s[pick].sum())
        / (step_s[pick].sum() + detok_s[pick].sum()),
    )
    del engine
    return result


def measure_defaults(artifact: Path, args: argparse.Namespace) -> None:
    """The measurements behind the engine's defaults (engine/config.py): the best of several
    steps, so a shared machine's noise inflates them least.
    - prefill: one chunk of C tokens alone in a step, for each C (interleaved over 4 rounds);
    - decode: a step of n sequences with 200-token contexts, for each block size and n."""
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.core import EngineCore
    from ortserve.engine.ipc import EngineRequest
    from ortserve.sampling_params import SamplingParams

    affinity = os.sched_getaffinity(0)
    rng = np.random.default_rng(0)
    sizes = [32, 64, 128, 256, 512, 1024]
    engine = EngineCore(
        EngineConfig(
            model=str(artifact),
            kv_cache_space=1.0,
            max_num_batched_tokens=max(sizes),
            enable_prefix_caching=False,
            threads_bind=args.threads_bind,
        )
    )
    best = dict.fromkeys(sizes, float("inf"))
    for rnd in range(4):
        for size in sizes:
            engine.add_request(
                EngineRequest(
                    f"{rnd}-{size}",
                    rng.integers(100, 40000, size).tolist(),
                    SamplingParams(max_tokens=1, temperature=0.0),
                )
            )
            start = time.perf_counter()
            engine.step()
            best[size] = min(best[size], time.perf_counter() - start)
    for size in sizes:
        print(f"prefill chunk {size:5d}: {1e3 * best[size]:7.1f} ms  {size / best[size]:6.0f} tok/s", flush=True)
    del engine
    for block_size in args.block_sizes:
        for seqs in args.max_num_seqs:
            os.sched_setaffinity(0, affinity)
            engine = EngineCore(
                EngineConfig(
                    model=str(artifact),
                    kv_cache_space=1.0,
                    block_size=block_size,
                    max_num_seqs=seqs,
                    max_num_batched_tokens=2048,
                    threads_bind=args.threads_bind,
                )
            )
            for i in range(seqs):
                engine.add_request(
                    EngineRequest(
                        f"d{i}",
                        rng.integers(100, 40000, 200).tolist(),
                        SamplingParams(max_tokens=1000, ignore_eos=True),
                    )
                )
            while engine.scheduler.waiting or any(not s.is_prefilled for s in engine.scheduler.running):
                engine.step()
            times = []
            for _ in range(12):
                start = time.perf_counter()
                engine.step()
                times.append(time.perf_counter() - start)
            print(
                f"decode block {block_size:3d} seqs {seqs:3d}: best {1e3 * min(times):7.1f} ms, median "
                f"{1e3 * float(np.median(times)):7.1f} ms -> {seqs / min(times):6.1f} tok/s",
                flush=True,
            )
            del engine
    os.sched_setaffinity(0, affinity)


def measure_long_decode(artifact: Path, args: argparse.Namespace) -> None:
    """Output processing (detokenisation and a stop-string search) per step over one long decode:
    the time per step must not grow with the length of the text (issue #16). Prints the mean of
    the first and the last 500 steps and their ratio."""
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.core import EngineCore
    from ortserve.engine.ipc import EngineRequest
    from ortserve.engine.output_processor import OutputProcessor
    from ortserve.sampling_params import SamplingParams
    from ortserve.tokenizer import load_tokenizer

    length = args.long_decode
    engine = EngineCore(
        EngineConfig(
            model=str(artifact),
            kv_cache_space=args.kv_cache_space,
            max_model_len=length + 64,
            threads_bind=args.threads_bind,
        )
    )
    processor = OutputProcessor(load_tokenizer(engine.tokenizer_dir))
    params = SamplingParams(
        temperature=1.0, seed=0, max_tokens=length, ignore_eos=True, stop=["a stop string that never appears " * 4]
    )
    prompt = list(range(1000, 1032))
    engine.add_request(EngineRequest("long", prompt, params))
    processor.add_request("long", prompt, params)
    per_step = []
    while processor.has_unfinished_requests():
        outputs = engine.step()
        t0 = time.perf_counter()
        processor.process_outputs(outputs)
        per_step.append(time.perf_counter() - t0)
    first, last = np.median(per_step[:500]) * 1e6, np.median(per_step[-500:]) * 1e6
    print(
        f"{artifact.name}: {len(per_step)} steps; output processing per step (median): first 500 {first:.1f} us, "
        f"last 500 {last:.1f} us, ratio {last / first:.2f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="built-in model name (default: the embedded SmolLM2)")
    parser.add_argument(
        "--artifact",
        action="append",
        default=None,
        help="benchmark this artifact directory instead (repeatable; overrides --precisions)",
    )
    parser.add_argument("--precisions", nargs="+", default=["fp32", "int4"])
    parser.add_argument("--max-num-seqs", nargs="+", type=int, default=[1, 8, 32])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0, help="1.0 as vLLM's benchmark; 0 = greedy")
    parser.add_argument(
        "--max-num-batched-tokens",
        nargs="+",
        type=int,
        default=None,
        help="token budgets to sweep (default: the engine's)",
    )
    parser.add_argument("--block-sizes", nargs="+", type=int, default=None, help="block sizes to sweep")
    parser.add_argument("--kv-cache-space", type=float, default=2.0)
    parser.add_argument("--threads-bind", default="auto")
    parser.add_argument(
        "--long-decode",
        type=int,
        default=None,
        metavar="TOKENS",
        help="instead, time output processing per step over one decode of this many tokens",
    )
    parser.add_argument(
        "--defaults",
        action="store_true",
        help="run the measurements behind the engine defaults instead (prefill chunk sizes, "
        "decode steps per block size and sequence count)",
    )
    args = parser.parse_args(argv)
    from ortserve.engine.config import DEFAULT_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS

    args.max_num_batched_tokens = args.max_num_batched_tokens or [DEFAULT_MAX_NUM_BATCHED_TOKENS]
    args.block_sizes = args.block_sizes or [DEFAULT_BLOCK_SIZE]

    if args.artifact:
        from ortserve.artifact import load_manifest

        targets = [(Path(a), load_manifest(a).weight_precision) for a in args.artifact]
    else:
        from ortserve.models import resolve_model

        targets = [(resolve_model(args.model, precision=p), p) for p in args.precisions]
    if args.long_decode:
        for artifact, _ in targets:
            measure_long_decode(artifact, args)
        return 0
    if args.defaults:
        for artifact, _ in targets:
            measure_defaults(artifact, args)
        return 0
    load = os.getloadavg()[0]
    print(
        f"# load average before: {load:.2f} on {os.cpu_count()} CPUs"
        + ("  (BUSY MACHINE: figures will be low)" if load > 0.5 else ""),
        file=sys.stderr,
    )
    results = []
    sweep = itertools.product(targets, args.block_sizes, args.max_num_batched_tokens, args.max_num_seqs)
    for (artifact, precision), block_size, budget, seqs in sweep:
        affinity = os.sched_getaffinity(0)  # the engine pins this thread: undo it between runs
        r = run_one(artifact, precision, seqs, block_size, budget, args)
        os.sched_setaffinity(0, affinity)
        results.append(r)
        print(
            f"{precision:5s} block {block_size:3d} budget {budget:4d} max-num-seqs {seqs:3d}: "
            f"{r.output_tokens_per_s:7.1f} output tok/s "
            f"({r.total_tokens_per_s:7.1f} total) in {r.wall_seconds:6.1f} s | step {r.mean_step_ms:6.1f} ms, "
            f"python {r.python_ms_per_step:5.2f} ms ({100 * r.python_share:4.1f}%) | decode steps at cap: "
            f"{r.decode_step_ms:6.1f} ms, python {r.decode_python_ms:5.2f} ms "
            f"({100 * r.decode_python_share:4.1f}%, {100 * r.decode_python_share_with_detok:4.1f}% with detok)",
            flush=True,
        )
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"bench_offline-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(
        json.dumps({"load_average_before": load, "args": vars(args), "results": [asdict(r) for r in results]}, indent=2)
        + "\n"
    )
    print(f"# written {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
