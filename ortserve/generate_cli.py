"""`ortserve generate [MODEL] "prompt"`: a quick try of the offline engine from the shell.

MODEL is what every command takes (an artifact, checkpoint or .gguf path, or a built-in name), as
the first word or as --model; without either, the default model answers.

The answer streams to stdout as it is generated; the engine's start-up block and a one-line
summary (tokens, time, tokens/s) go to stderr. A sampling flag left out takes the model's
generation_config.json value (``--generation-config auto``, as the server and the offline LLM),
else CLI_DEFAULTS: greedy, 256 tokens.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

HELP = "generate text for a prompt with the offline engine (streams the answer)"
CLI_DEFAULTS = {"max_tokens": 256, "temperature": 0.0}
SAMPLING_FLAGS = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ortserve.engine.config import add_engine_arguments

    parser.add_argument(
        "prompt",
        nargs="+",
        metavar="[MODEL] PROMPT",
        help="the prompt (several words are joined with spaces); a first word that names a model (an "
        "artifact, checkpoint or .gguf path, or a built-in name) is the model, unless --model is given",
    )
    # Left out, these come from the model's generation_config.json (--generation-config auto), else
    # from CLI_DEFAULTS: a quick try is greedy unless the model's creator chose its sampling.
    parser.add_argument("--max-tokens", type=int, default=None, help="most tokens to generate (default 256)")
    parser.add_argument("--temperature", type=float, default=None, help="0 = greedy (the default)")
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--min-p", type=float, default=None)
    parser.add_argument("--repetition-penalty", type=float, default=None)
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


def split_model_argument(model: str | None, words: list[str]) -> tuple[str | None, list[str]]:
    """(model, prompt words) of `generate MODEL PROMPT...` as of `generate --model MODEL PROMPT...`:
    without --model, a first word that names a model is the model; a ValueError if no prompt follows."""
    from ortserve.models.source import ModelSourceError, find_source

    if model is not None or not words:
        return model, words
    try:
        find_source(words[0])
    except ModelSourceError:
        return None, words  # a prompt's first word
    if len(words) == 1:
        raise ValueError(f"{words[0]!r} is a model: give the prompt after it, as in: ortserve generate MODEL 'PROMPT'")
    return words[0], words[1:]


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from ortserve.engine.config import EngineConfig
    from ortserve.engine.llm_engine import LLMEngine
    from ortserve.sampling_params import SamplingParams, model_sampling_defaults
    from ortserve.tokenizer import ChatPrompts

    typed = {name: getattr(args, name) for name in SAMPLING_FLAGS if getattr(args, name) is not None}
    try:
        args.model, words = split_model_argument(args.model, args.prompt)
        prompt = " ".join(words)
        SamplingParams(**{**CLI_DEFAULTS, **typed}, seed=args.seed, stop=args.stop)  # a bad flag fails before the load
        config = EngineConfig.from_args(args)
        engine = LLMEngine.from_config(config)
        model_defaults = {}
        if config.generation_config == "auto":
            model_defaults = model_sampling_defaults(engine.info().artifact_dir)
            if model_defaults:
                logging.getLogger("ortserve.generate").info("the model's sampling defaults: %s", model_defaults)
        params = SamplingParams(**{**CLI_DEFAULTS, **model_defaults, **typed}, seed=args.seed, stop=args.stop)
        prompts = ChatPrompts(engine.tokenizer)
        if args.chat and prompts.has_chat_template:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            messages.append({"role": "user", "content": prompt})
            token_ids = prompts.chat_token_ids(messages)
        else:
            if args.chat:
                logging.getLogger("ortserve.generate").warning(
                    "the model has no chat template: the prompt is completed as plain text "
                    "(give a template with --chat-template FILE|STRING, or --no-chat to silence this)"
                )
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
