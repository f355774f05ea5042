"""Runs ``ortserve serve``'s server around the FakeCore (fake_engine.py), for HTTP-layer tests:
python fake_server.py TOKENIZER_DIR [--max-num-seqs N] [--step-seconds S] [--fail MSG] [serve flags]
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from fake_engine import FakeEngineFactory

from ortserve.engine.config import EngineConfig
from ortserve.server.prompts import block_torch_import
from ortserve.server.settings import ServerSettings


def main() -> int:
    block_torch_import()
    from ortserve.server.cli import serve

    parser = argparse.ArgumentParser()
    parser.add_argument("tokenizer_dir")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-num-seqs", type=int, default=4)
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--step-seconds", type=float, default=0.02)
    parser.add_argument("--fail", default=None)
    parser.add_argument("--load-seconds", type=float, default=0.0)
    parser.add_argument("--fail-after-steps", type=int, default=None)
    parser.add_argument("--api-key", default=None)
    parser.add_argument("--max-waiting-requests", type=int, default=256)
    parser.add_argument("--max-request-body-bytes", type=int, default=1 << 20)
    parser.add_argument("--drain-timeout", type=float, default=30.0)
    args = parser.parse_args()
    factory = FakeEngineFactory(args.tokenizer_dir, args.max_model_len, args.max_num_seqs,
                                args.step_seconds, args.fail, args.load_seconds,
                                args.fail_after_steps)
    settings = ServerSettings(served_model_name="fake", api_key=args.api_key,
                              max_waiting_requests=args.max_waiting_requests,
                              max_request_body_bytes=args.max_request_body_bytes,
                              drain_timeout=args.drain_timeout)
    config = EngineConfig(max_num_seqs=args.max_num_seqs)
    return asyncio.run(serve(config, settings, "127.0.0.1", args.port, "warning", factory=factory))


if __name__ == "__main__":
    sys.exit(main())
