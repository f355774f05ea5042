"""transformers generate() fp32 baseline, run inside the peers venv (benchmarks/.venv-peers).

    python hf_bench.py CHECKPOINT_DIR PROMPTS.json [--output-len N] [--threads 2] [--out result.json]

One prompt at a time (batch 1, greedy, eager attention, KV cache on), output length pinned with
min_new_tokens = max_new_tokens. A streamer timestamps every token, so TTFT and decode tok/s are
defined as in `ortserve bench serve`.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer


class Clock(BaseStreamer):
    """put() is called once with the prompt, then once per generated token."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def run(model, prompt: list[int], output_len: int) -> dict:
    ids = torch.tensor([prompt], dtype=torch.long)
    clock = Clock()
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=output_len,
            min_new_tokens=output_len,
            streamer=clock,
            pad_token_id=0,
        )
    end = time.perf_counter()
    n = out.shape[1] - len(prompt)
    first = clock.times[1]  # times[0]: the prompt itself
    return {
        "prompt_len": len(prompt),
        "output_len": n,
        "ttft_s": first - start,
        "total_s": end - start,
        "prompt_tok_s": len(prompt) / (first - start),
        "decode_tok_s_per_seq": (n - 1) / (end - first) if n > 1 else None,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint")
    p.add_argument("prompts")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(
        args.checkpoint, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    prompts = json.loads(open(args.prompts).read())
    run(model, prompts[0], 4)  # warm-up
    result = {
        "mode": "single",
        "runs": [run(model, pr, args.output_len) for pr in prompts],
        "torch": torch.__version__,
        "threads": args.threads,
    }
    text = json.dumps(result, indent=1)
    if args.out:
        open(args.out, "w").write(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
