"""onnxruntime-genai measurements, run inside the peers venv (benchmarks/.venv-peers).

    python genai_bench.py MODEL_DIR PROMPTS.json MODE [--batch N] [--output-len N] [--out result.json]

PROMPTS.json: a list of token-id lists (all of one length). MODE:
  single  batch 1, one prompt at a time: TTFT (prompt processing) and decode tok/s per prompt
  static  one static batch of --batch prompts through og.Generator: batch TTFT, end-to-end output tok/s
  engine  og.Engine (continuous batching): every prompt, at most --batch in flight
Output length is pinned with min_length = max_length (random weights may emit EOS).
Definitions match `ortserve bench serve`: TTFT = start to first token; decode tok/s =
(tokens - 1) / (end - first token); output throughput = all generated tokens / wall time.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime_genai as og


def generator_run(model, prompts: list[list[int]], output_len: int) -> dict:
    """One og.Generator over a static batch; every sequence gets exactly output_len new tokens."""
    params = og.GeneratorParams(model)
    prompt_len = len(prompts[0])
    params.set_search_options(
        do_sample=False, batch_size=len(prompts), max_length=prompt_len + output_len, min_length=prompt_len + output_len
    )
    start = time.perf_counter()
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompts, dtype=np.int32))  # prefill happens here
    generator.generate_next_token()
    first = time.perf_counter()
    steps = 1
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    end = time.perf_counter()
    del generator
    batch = len(prompts)
    return {
        "batch": batch,
        "prompt_len": prompt_len,
        "output_len": steps,
        "ttft_s": first - start,
        "total_s": end - start,
        "decode_tok_s_per_seq": (steps - 1) / (end - first) if steps > 1 else None,
        "output_throughput": batch * steps / (end - start),
        "prompt_tok_s": batch * prompt_len / (first - start),
    }


def engine_run(model, prompts: list[list[int]], output_len: int, concurrency: int) -> dict:
    """og.Engine (continuous batching), closed loop as `ortserve bench serve --max-concurrency`:
    at most `concurrency` requests in flight, the next one submitted when one finishes.
    TTFT and E2EL count from each request's own submission."""
    engine = og.Engine(model)
    buffer = engine.create_event_buffer(4096)
    pending = list(enumerate(prompts))
    sent, first, done, tokens, live = {}, {}, {}, {}, {}

    def submit():
        i, prompt = pending.pop(0)
        request = engine.create_request()
        options = og.TurnOptions(request)
        options.set_max_generated_tokens(output_len)
        options.set_min_generated_tokens(output_len)
        options.set_do_sample(False)
        sent[i] = time.perf_counter()
        request.begin_turn(np.asarray(prompt, dtype=np.int32), options)
        live[id(request)] = (i, request)

    start = time.perf_counter()
    while pending and len(live) < concurrency:
        submit()
    while engine.has_pending_requests() or pending:
        for event in engine.run(buffer):
            now = time.perf_counter()
            if event.flags & og.EngineEventFlags.FAILED:
                raise RuntimeError(f"og.Engine failed: {event.error_code}")
            i, _ = live[id(event.request)]
            if event.flags & og.EngineEventFlags.TOKEN:
                first.setdefault(i, now - sent[i])
                tokens[i] = tokens.get(i, 0) + 1
            if event.flags & og.EngineEventFlags.TURN_FINISHED:
                done[i] = now - sent[i]
                live.pop(id(event.request))[1].close()
                if pending:
                    submit()
    end = time.perf_counter()
    n = range(len(prompts))
    return {
        "concurrency": concurrency,
        "num_prompts": len(prompts),
        "prompt_len": len(prompts[0]),
        "output_lens": [tokens.get(i, 0) for i in n],
        "ttfts_s": [first.get(i) for i in n],
        "e2els_s": [done.get(i) for i in n],
        "total_s": end - start,
        "output_throughput": sum(tokens.values()) / (end - start),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_dir")
    p.add_argument("prompts")
    p.add_argument("mode", choices=("single", "static", "engine"))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--warmup", type=int, default=1, help="untimed runs first (single/static)")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    prompts = json.loads(open(args.prompts).read())
    model = og.Model(args.model_dir)
    if args.mode == "single":
        for _ in range(args.warmup):
            generator_run(model, prompts[:1], min(args.output_len, 8))
        runs = [generator_run(model, [pr], args.output_len) for pr in prompts]
        result = {"mode": "single", "runs": runs}
    elif args.mode == "static":
        batch = prompts[: args.batch]
        for _ in range(args.warmup):
            generator_run(model, batch, min(args.output_len, 4))
        result = {"mode": "static", "runs": [generator_run(model, batch, args.output_len)]}
    else:
        result = {"mode": "engine", "runs": [engine_run(model, prompts, args.output_len, args.batch)]}
    result["onnxruntime_genai"] = og.__version__ if hasattr(og, "__version__") else "?"
    text = json.dumps(result, indent=1)
    if args.out:
        open(args.out, "w").write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
