"""transformers generate(), fp32, batch 1: the baseline. Runs benchmarks/peers/hf_bench.py in the
peers venv."""

from __future__ import annotations

import json

import numpy as np

from runners.common import BENCH_DIR, PEERS_PY, RESULTS, WORKLOADS, Model, record, run_logged, token_prompts

SYSTEM = "transformers"
PRECISIONS = ("fp32",)
WORKLOADS_SUPPORTED = ("decode", "prefill")
SCRIPT = BENCH_DIR / "peers" / "hf_bench.py"


def run(model: Model, precision: str, workloads: list[str]):
    for name in workloads:
        w = WORKLOADS[name]
        raw = RESULTS / "raw" / model.name / f"{SYSTEM}--{precision}" / f"{name}.json"
        raw.parent.mkdir(parents=True, exist_ok=True)
        prompts = raw.with_suffix(".prompts.json")
        prompts.write_text(json.dumps(token_prompts(model, w)))
        run_logged(
            [
                str(PEERS_PY),
                str(SCRIPT),
                str(model.hf_dir),
                str(prompts),
                "--output-len",
                str(w.output_len),
                "--out",
                str(raw),
            ],
            raw.with_suffix(".log"),
        )
        runs = json.loads(raw.read_text())["runs"]
        m = {
            "prompt_tok_s": float(np.median([r["prompt_tok_s"] for r in runs])),
            "ttft_p50_ms": float(np.median([r["ttft_s"] for r in runs]) * 1000),
        }
        if w.kind == "decode":
            m["decode_tok_s"] = float(np.median([r["decode_tok_s_per_seq"] for r in runs]))
        yield record(
            model.name,
            SYSTEM,
            precision,
            w,
            m,
            f"python benchmarks/peers/hf_bench.py {model.hf_dir.name} PROMPTS.json --output-len {w.output_len}",
            raw,
            notes="eager attention, torch 2.13.0 CPU, 2 threads",
        )
