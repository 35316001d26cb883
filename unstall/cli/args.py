"""argparse pieces that several subcommands take, declared and read in one place.

``-- COMMAND [ARGS...]`` (`unstall run`, `unstall analyze`) and ``--json FILE``
(`unstall run`, `unstall analyze`, `unstall bench`). Not a subcommand itself.
"""

from __future__ import annotations

import argparse


def add_json(p: argparse.ArgumentParser, what: str) -> None:
    """``--json FILE``: also write ``what`` (e.g. "the figures") to FILE as JSON."""
    p.add_argument("--json", metavar="FILE", help=f"also write {what} to FILE as JSON")


def add_command(p: argparse.ArgumentParser, note: str = "") -> None:
    """A trailing ``-- COMMAND [ARGS...]``: all after ``--`` is the command, taken as given."""
    p.add_argument(
        "command",
        nargs=argparse.REMAINDER,
        help="-- COMMAND [ARGS...]" + (f" {note}" if note else ""),
    )


def command_of(args: argparse.Namespace) -> list[str]:
    """The command given after ``--`` ([] if none): argparse leaves the ``--`` in a REMAINDER."""
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    return command
