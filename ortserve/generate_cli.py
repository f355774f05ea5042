"""`ortserve generate "prompt"`: a quick try of the offline engine from the shell.

The answer streams to stdout as it is generated; the engine's start-up block and a one-line
summary (tokens, time, tokens/s) go to stderr.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

HELP = "generate text for a prompt with the offline engine (streams the answer)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ortserve.engine.config import add_engine_arguments

    parser.add_argument("prompt", nargs="+", help="the prompt (several words are joined with spaces)")
    parser.add_argument("--max-tokens", type=int, default=256, help="most tokens to generate (default 256)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=None, help="a stop string (repeatable)")
    parser.add_argument("--no-chat", dest="chat", action="store_false",
                        help="send the prompt as raw text instead of a user message through the chat template")
    parser.add_argument("--system", default=None, help="a system message (chat mode)")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.core import EngineCore
    from ortserve.engine.messages import EngineRequest
    from ortserve.engine.output_processor import OutputProcessor
    from ortserve.sampling_params import SamplingParams

    try:
        params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                                top_k=args.top_k, seed=args.seed, stop=args.stop)
        engine = EngineCore(EngineConfig.from_args(args))
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(engine.tokenizer_dir)
    prompt = " ".join(args.prompt)
    if args.chat and tokenizer.chat_template:
        messages = ([{"role": "system", "content": args.system}] if args.system else [])
        messages.append({"role": "user", "content": prompt})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        token_ids = tokenizer.encode(text, add_special_tokens=False)
    else:
        token_ids = tokenizer.encode(prompt)
    processor = OutputProcessor(tokenizer)
    try:
        engine.add_request(EngineRequest("cli", token_ids, params))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    processor.add_request("cli", token_ids, params)
    started, first, completion = time.perf_counter(), None, None
    while processor.has_unfinished_requests():
        outputs, to_abort = processor.process_outputs(engine.step())
        if to_abort:
            engine.abort_requests(to_abort)
        for output in outputs:
            completion = output.outputs[0]
            if completion.token_ids and first is None:
                first = time.perf_counter()
            sys.stdout.write(completion.text_delta)
            sys.stdout.flush()
    elapsed = time.perf_counter() - started
    sys.stdout.write("\n")
    num = len(completion.token_ids) if completion else 0
    decode = (num - 1) / (elapsed - (first - started)) if first and num > 1 and elapsed > first - started else 0.0
    print(f"[{len(token_ids)} prompt tokens, {num} generated, finish {completion.finish_reason if completion else None}; "
          f"first token {((first or started) - started) * 1000:.0f} ms, {decode:.1f} tokens/s after]", file=sys.stderr)
    return 0
