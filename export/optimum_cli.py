"""``optimum-cli export ortserve SRC -o OUT``: the ``ortserve export`` command as an optimum CLI
plugin. optimum loads ``REGISTER_COMMANDS`` from any module in its ``optimum.commands.register``
namespace; the wheel places a one-line module there (``from ortserve.export.optimum_cli import
REGISTER_COMMANDS``). Only optimum-cli imports this file, so serving never imports optimum.
"""

from __future__ import annotations

from optimum.commands.base import BaseOptimumCLICommand, CommandInfo
from optimum.commands.export.base import ExportCommand

from . import cli


class OrtserveExportCommand(BaseOptimumCLICommand):
    COMMAND = CommandInfo(name="ortserve", help=cli.HELP)

    @staticmethod
    def parse_args(parser) -> None:
        cli.add_arguments(parser)

    def run(self) -> None:
        code = cli.run(self.args)
        if code:
            raise SystemExit(code)


REGISTER_COMMANDS = [(OrtserveExportCommand, ExportCommand)]
