"""The `unstall` command: one module per subcommand, each with ``add_parser`` and ``run``."""

from unstall.cli.main import SUBCOMMANDS, build_parser, main

__all__ = ["SUBCOMMANDS", "build_parser", "main"]
