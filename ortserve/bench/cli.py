"""`ortserve bench SUBCOMMAND`: one benchmark per subcommand (today: serve)."""

from __future__ import annotations

import argparse
import importlib

HELP = "benchmarks: `ortserve bench serve` measures a running OpenAI-compatible server"

SUBCOMMANDS = {"serve": "ortserve.bench.serve"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subparsers = parser.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = subparsers.add_parser(name, help=module.HELP, description=module.HELP)
        module.add_arguments(sub)
        sub.set_defaults(bench_run=module.run)


def run(args: argparse.Namespace) -> int:
    return int(args.bench_run(args) or 0)
