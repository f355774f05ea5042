"""``optimum-cli export ortserve`` runs the same export as ``ortserve export``."""
from __future__ import annotations

import pytest

from ortserve.artifact import load_manifest


def test_optimum_cli_export_ortserve_writes_an_artifact(tiny_checkpoint, tmp_path):
    pytest.importorskip("optimum.commands")
    from optimum.commands.optimum_cli import (
        OPTIMUM_CLI_ROOT_SUBCOMMANDS,
        RootOptimumCLICommand,
        register_optimum_cli_subcommand,
        resolve_command_to_command_instance,
    )
    from ortserve.export.optimum_cli import REGISTER_COMMANDS

    root = RootOptimumCLICommand("optimum-cli")
    for command in OPTIMUM_CLI_ROOT_SUBCOMMANDS:
        register_optimum_cli_subcommand(command, parent_command=root)
    parents = resolve_command_to_command_instance(root, [parent for _, parent in REGISTER_COMMANDS])
    for command, parent in REGISTER_COMMANDS:
        register_optimum_cli_subcommand(command, parent_command=parents[parent])
    out = tmp_path / "artifact"
    args = root.parser.parse_args(["export", "ortserve", str(tiny_checkpoint("llama2")), "-o", str(out),
                                   "--precision", "int8", "--quiet"])
    args.func(args).run()
    assert load_manifest(out).weight_precision == "int8"
