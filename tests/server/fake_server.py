"""Runs ``ortserve serve`` around the FakeCore (fake_engine.py), for HTTP-layer tests:
python fake_server.py TOKENIZER_DIR [fake flags] [any `ortserve serve` flag]
"""

from __future__ import annotations

import argparse
import sys

from fake_engine import FakeEngineFactory

from ortserve.server import cli


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("tokenizer_dir")
    parser.add_argument("--step-seconds", type=float, default=0.02)
    parser.add_argument("--fail", default=None)
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--fail-after-steps", type=int, default=None)
    parser.add_argument("--max-generated", type=int, default=2**62)
    cli.add_arguments(parser)
    parser.set_defaults(
        port=0,
        log_level="warning",
        max_num_seqs=4,
        max_model_len=256,
        served_model_name="fake",
        max_request_body_bytes=1 << 20,
    )
    args = parser.parse_args()
    factory = FakeEngineFactory(
        args.tokenizer_dir,
        args.max_model_len,
        args.max_num_seqs,
        args.step_seconds,
        args.fail,
        args.load_seconds,
        args.fail_after_steps,
        args.max_generated,
    )
    return cli.run(args, factory)


if __name__ == "__main__":
    sys.exit(main())
