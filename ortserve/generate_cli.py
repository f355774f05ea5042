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
    parser.add_argument(
        "--no-chat",
        dest="chat",
        action="store_false",
        help="send the prompt as raw text instead of a user message through the chat template",
    )
    parser.add_argument("--system", default=None, help="a system message (chat mode)")
    add_engine_arguments(parser)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.llm_engine import LLMEngine
    from ortserve.sampling_params import SamplingParams
    from ortserve.tokenizer import ChatPrompts

    prompt = " ".join(args.prompt)
    try:
        params = SamplingParams(
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            seed=args.seed,
            stop=args.stop,
        )
        engine = LLMEngine.from_config(EngineConfig.from_args(args))
        prompts = ChatPrompts(engine.tokenizer)
        if args.chat and prompts.has_chat_template:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            messages.append({"role": "user", "content": prompt})
            token_ids = prompts.chat_token_ids(messages)
        else:
            token_ids = prompts.encode(prompt)
        engine.add_request("cli", token_ids, params)
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    started, first, generated, finish = time.perf_counter(), None, 0, None
    for delta in engine.run():
        for sample in delta.samples:
            if sample.token_ids and first is None:
                first = time.perf_counter()
            generated += len(sample.token_ids)
            finish = sample.finish_reason or finish
            sys.stdout.write(sample.text)
            sys.stdout.flush()
    elapsed = time.perf_counter() - started
    sys.stdout.write("\n")
    after = elapsed - ((first or started) - started)
    decode = (generated - 1) / after if first and generated > 1 and after > 0 else 0.0
    print(
        f"[{len(token_ids)} prompt tokens, {generated} generated, finish {finish}; "
        f"first token {((first or started) - started) * 1000:.0f} ms, {decode:.1f} tokens/s after]",
        file=sys.stderr,
    )
    return 0 if finish != "error" else 1
