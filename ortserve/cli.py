"""`ortserve` command line: one subcommand per module, imported only when it runs."""

from __future__ import annotations

import argparse
import importlib
import sys

from ortserve import __version__

# subcommand -> module exposing HELP, add_arguments(parser) and run(args) -> int.
# Each module keeps heavy imports inside run(), so `ortserve --help` stays fast.
COMMANDS = {
    "export": "ortserve.export.cli",
    "generate": "ortserve.generate_cli",
    "serve": "ortserve.server.cli",
    "bench": "ortserve.bench.cli",
    "bundle": "ortserve.deploy.bundle",
    "serve-cluster": "ortserve.deploy.cluster",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ortserve", description="LLM serving on CPU with ONNX Runtime")
    parser.add_argument("--version", action="version", version=f"ortserve {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
