"""``unstall run [--json FILE] [--config FILE] -- COMMAND ...``: a script under unstall."""

from __future__ import annotations

import argparse
import sys

from unstall.cli.args import add_command, add_json, command_of


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="run a training script unchanged with unstall's DataLoader, then report its stalls",
        description=(
            "Runs COMMAND (e.g. `python train.py ARGS` or `torchrun ... train.py`) with "
            "torch.utils.data.DataLoader swapped for unstall's in every Python process it "
            "starts. At exit, prints per loader (and per rank): batches, the share of time "
            "the training loop waited for data, worker fetch and prepare time per batch, "
            "and throughput. Signals and the exit status are the program's own."
        ),
    )
    add_json(p, "the figures")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="loader settings (a JSON object of DataLoader kwargs, e.g. from `unstall analyze`)"
        " applied to every loader the program makes",
    )
    add_command(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from unstall.launch.command import exec_command, run_env

    command = command_of(args)
    if not command:
        print(
            "unstall run: give the command after --, e.g. unstall run -- python train.py",
            file=sys.stderr,
        )
        return 2
    try:
        env = run_env(json_path=args.json, config_path=args.config)
    except ValueError as exc:
        print(f"unstall run: {exc}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return exec_command(command, env)  # a Python program: does not return (exec)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 127
