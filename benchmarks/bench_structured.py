"""Decode speed with a JSON schema active vs unconstrained (issue #13: structured outputs cost).

For each concurrency c, c requests of the same 64-token prompt decode ``--output-len`` tokens with
``ignore_eos``, once unconstrained and once under a JSON schema (a list of records that cannot end
before the output length: the grammar is live on every step). Only decode steps that carry all c
sequences count; decode tok/s = c / median step time. Runs alternate (plain, schema) over
``--rounds`` rounds and the best median of each is kept, so a shared machine's noise hurts least.
The grammar's mask is computed in a worker thread while the model runs (engine/grammar.py), so
the overhead is what that overlap does not hide: applying the mask, and the matcher's advance.

    python benchmarks/bench_structured.py                          # SmolLM2 int4, concurrency 1 and 16
    python benchmarks/bench_structured.py --artifact ./my-artifact --concurrency 1 4 16 --rounds 5

Results go to stdout and, as JSON, to benchmarks/results/bench_structured-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

SCHEMA = {
    "type": "object",
    "properties": {
        "records": {
            "type": "array",
            "minItems": 60,
            "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 0, "maximum": 99999},
                    "name": {"type": "string", "maxLength": 16},
                    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
                    "active": {"type": "boolean"},
                },
                "required": ["id", "name", "tags", "active"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["records"],
    "additionalProperties": False,
}


def decode_rate(core, concurrency: int, output_len: int, schema: dict | None, tag: str) -> tuple[float, int]:
    """Median step time of the decode steps that carry all ``concurrency`` sequences -> tok/s."""
    from ortserve.engine.ipc import EngineRequest
    from ortserve.sampling_params import SamplingParams, StructuredOutputs

    spec = StructuredOutputs(json=schema) if schema is not None else None
    params = SamplingParams(
        temperature=1.0, seed=0, max_tokens=output_len, ignore_eos=True, structured_outputs=spec
    )  # fmt: skip
    prompt = list(range(1000, 1064))
    for i in range(concurrency):
        core.add_request(EngineRequest(f"{tag}-{i}", prompt, params))
    times = []
    while core.has_unfinished_requests():
        running = core.scheduler.running
        full = (
            len(running) == concurrency
            and not core.scheduler.waiting
            and all(s.num_computed_tokens == s.num_tokens - 1 for s in running)
        )
        start = time.perf_counter()
        core.step()
        if full:
            times.append(time.perf_counter() - start)
    core.block_manager.check_idle()
    return concurrency / float(np.median(times)), len(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifact", default=None, help="artifact directory (default: the built-in SmolLM2)")
    parser.add_argument("--precision", default="int4", help="precision of the built-in model (default int4)")
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kv-cache-space", type=float, default=1.0)
    parser.add_argument("--threads-bind", default="auto")
    args = parser.parse_args(argv)

    from ortserve.engine.config import EngineConfig
    from ortserve.engine.core import EngineCore
    from ortserve.tokenizer import load_tokenizer

    if args.artifact is None:
        from ortserve.models import resolve_model

        artifact = Path(resolve_model(None, precision=args.precision))
    else:
        artifact = Path(args.artifact)
    load = os.getloadavg()[0]
    print(
        f"# {artifact}; load average before: {load:.2f} on {os.cpu_count()} CPUs"
        + ("  (BUSY MACHINE: figures will be low)" if load > 0.5 else ""),
        file=sys.stderr,
    )
    affinity = os.sched_getaffinity(0)
    core = EngineCore(
        EngineConfig(
            model=str(artifact),
            max_num_seqs=max(args.concurrency),
            kv_cache_space=args.kv_cache_space,
            threads_bind=args.threads_bind,
        )
    )
    core.enable_structured_outputs(load_tokenizer(core.tokenizer_dir))
    decode_rate(core, 1, 4, SCHEMA, "warm-up")  # builds llguidance's tokenizer, compiles the schema
    rows = []
    for concurrency in args.concurrency:
        best = {"plain": 0.0, "schema": 0.0}
        for r in range(args.rounds):
            for name, schema in (("plain", None), ("schema", SCHEMA)):
                rate, _ = decode_rate(core, concurrency, args.output_len, schema, f"{name}-{concurrency}-{r}")
                best[name] = max(best[name], rate)
        ratio = best["schema"] / best["plain"]
        rows.append(
            {"concurrency": concurrency, "plain_tok_s": best["plain"], "schema_tok_s": best["schema"], "ratio": ratio}
        )
        print(
            f"concurrency {concurrency:3d}: unconstrained {best['plain']:7.1f} decode tok/s, "
            f"JSON schema {best['schema']:7.1f} decode tok/s ({100 * ratio:5.1f}%)",
            flush=True,
        )
    os.sched_setaffinity(0, affinity)
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"bench_structured-{time.strftime('%Y%m%d-%H%M%S')}.json"
    record = {"artifact": str(artifact), "load_average_before": load, "args": vars(args), "results": rows}
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"# written {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
