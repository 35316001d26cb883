"""The `unstall` command's parser and entry point: one module per subcommand, each with
``add_parser`` and ``run``; a subcommand's module is imported only when it is asked for."""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module; each module defines add_parser(subparsers) and run(args) -> int.
# Modules keep heavy imports (torch, numpy) inside run(), so `--help` stays fast.
SUBCOMMANDS = ("demo", "run", "analyze", "make_dataset", "bench", "cache", "index")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command's parser; with ``only``, just that subcommand's (`main` uses it so
    that `unstall run` imports nothing beyond its own module before it execs)."""
    parser = argparse.ArgumentParser(
        prog="unstall",
        description="Find and remove data stalls in PyTorch training.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS if only is None else (only,):
        try:
            module = importlib.import_module(f"unstall.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"unstall.cli.{name}":
                raise
            continue
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``unstall`` command."""
    argv = sys.argv[1:] if argv is None else argv
    first = argv[0].replace("-", "_") if argv else None
    parser = build_parser(first if first in SUBCOMMANDS else None)
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
