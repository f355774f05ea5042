"""onnxruntime-genai: its model builder exports the checkpoint (int4 / int8 / fp32, CPU, default
options), then benchmarks/peers/genai_bench.py runs in the peers venv:
  Static  og.Generator: batch 1 for decode and prefill, one static batch of N for serve-cN
  Engine  og.Engine (continuous batching) for serve-cN and shared-prefix, closed loop at N in flight
"""

from __future__ import annotations

import json

import numpy as np

from runners.common import (
    BENCH_DIR,
    PEER_MODELS,
    PEERS_PY,
    RESULTS,
    WORKLOADS,
    Model,
    distribution_ms,
    record,
    run_logged,
    token_prompts,
)

PRECISIONS = ("fp32", "int8", "int4")
SCRIPT = BENCH_DIR / "peers" / "genai_bench.py"


def model_dir(model: Model, precision: str):
    out = PEER_MODELS / model.name / f"genai-{precision}"
    if not (out / "genai_config.json").is_file():
        run_logged(
            [
                str(PEERS_PY),
                "-m",
                "onnxruntime_genai.models.builder",
                "-i",
                str(model.hf_dir),
                "-o",
                str(out),
                "-p",
                precision,
                "-e",
                "cpu",
                "-c",
                str(RESULTS / "cache" / "genai"),
            ],
            RESULTS / "logs" / f"genai-build-{model.name}-{precision}.log",
        )
    return out


def _measure(system: str, model: Model, precision: str, name: str, mode: str, batch: int, output_len: int):
    w = WORKLOADS[name]
    raw = RESULTS / "raw" / model.name / f"{system}--{precision}" / f"{name}.json"
    raw.parent.mkdir(parents=True, exist_ok=True)
    prompts = raw.with_suffix(".prompts.json")
    prompts.write_text(json.dumps(token_prompts(model, w)))
    path = model_dir(model, precision)
    argv = [
        str(PEERS_PY),
        str(SCRIPT),
        str(path),
        str(prompts),
        mode,
        "--batch",
        str(batch),
        "--output-len",
        str(output_len),
        "--out",
        str(raw),
    ]
    run_logged(argv, raw.with_suffix(".log"))
    command = (
        f"python -m onnxruntime_genai.models.builder -i {model.hf_dir.name} -o genai-{precision} -p {precision} -e cpu; "
        f"python benchmarks/peers/genai_bench.py genai-{precision} PROMPTS.json {mode} --batch {batch} --output-len {output_len}"
    )
    return w, json.loads(raw.read_text())["runs"], command, raw


class Static:
    SYSTEM = "genai-static"
    PRECISIONS = PRECISIONS
    WORKLOADS_SUPPORTED = ("decode", "prefill", "serve-c1", "serve-c4", "serve-c16", "serve-c32")

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        for name in workloads:
            w = WORKLOADS[name]
            if w.kind in ("decode", "prefill"):
                w, runs, cmd, raw = _measure(cls.SYSTEM, model, precision, name, "single", 1, w.output_len)
                m = {
                    "prompt_tok_s": float(np.median([r["prompt_tok_s"] for r in runs])),
                    "ttft_p50_ms": float(np.median([r["ttft_s"] for r in runs]) * 1000),
                }
                if w.kind == "decode":
                    m["decode_tok_s"] = float(np.median([r["decode_tok_s_per_seq"] for r in runs]))
                    m["output_throughput"] = float(np.median([r["output_throughput"] for r in runs]))
            else:  # serve-cN: one static batch of N prompts
                w, runs, cmd, raw = _measure(cls.SYSTEM, model, precision, name, "static", w.concurrency, w.output_len)
                r = runs[0]
                m = {
                    "output_throughput": r["output_throughput"],
                    "ttft_p50_ms": r["ttft_s"] * 1000,
                    "ttft_p99_ms": r["ttft_s"] * 1000,
                    "decode_tok_s_per_seq": r["decode_tok_s_per_seq"],
                    "tpot_p50_ms": 1000 / r["decode_tok_s_per_seq"],
                    "batch": r["batch"],
                }
            yield record(
                model.name,
                cls.SYSTEM,
                precision,
                w,
                m,
                cmd,
                raw,
                notes="og.Generator; serve-cN = one static batch of N (every request waits for the batch)",
            )


class Engine:
    SYSTEM = "genai-engine"
    PRECISIONS = PRECISIONS
    WORKLOADS_SUPPORTED = ("serve-c1", "serve-c4", "serve-c16", "serve-c32", "shared-prefix")

    @classmethod
    def run(cls, model: Model, precision: str, workloads: list[str]):
        for name in workloads:
            w = WORKLOADS[name]
            w, runs, cmd, raw = _measure(cls.SYSTEM, model, precision, name, "engine", w.concurrency, w.output_len)
            r = runs[0]
            ttft_p50, ttft_p99 = distribution_ms(r["ttfts_s"])
            tpots = [(e - t) / (n - 1) for e, t, n in zip(r["e2els_s"], r["ttfts_s"], r["output_lens"]) if n > 1]
            m = {
                "output_throughput": r["output_throughput"],
                "ttft_p50_ms": ttft_p50,
                "ttft_p99_ms": ttft_p99,
                "tpot_p50_ms": float(np.median(tpots) * 1000) if tpots else None,
                "e2el_p50_ms": distribution_ms(r["e2els_s"])[0],
                "completed": len(r["output_lens"]),
            }
            yield record(
                model.name,
                cls.SYSTEM,
                precision,
                w,
                m,
                cmd,
                raw,
                notes="og.Engine in-process, closed loop at N in flight (no HTTP)",
            )
