"""`unstall bench NAME`: run a named benchmark against torch's DataLoader, same run."""

from __future__ import annotations

import argparse
import inspect
import sys

from unstall.cli.args import add_json


def add_parser(sub: argparse._SubParsersAction) -> None:
    from unstall.bench import BENCHMARKS

    p = sub.add_parser(
        "bench",
        help="compare unstall with torch's DataLoader on a named benchmark",
        description="Run a benchmark: torch's DataLoader and unstall side by side in the same "
        "run, same data and pipeline; prints a table and the ratio unstall/baseline.",
    )
    p.add_argument("name", choices=sorted(BENCHMARKS), help="which benchmark")
    p.add_argument("--quick", action="store_true", help="a smaller run (about a minute)")
    p.add_argument(
        "--repeats", type=int, help="runs to take the median of (benchmarks that repeat)"
    )
    p.add_argument("--scale", action="store_true", help="`bench shards`: the 2 GB + 4 GB mode")
    p.add_argument("--scale-gb", type=float, help="`bench shards --scale`: the size in GB")
    add_json(p, "the figures")
    p.add_argument(
        "--model",
        choices=("resnet18", "resnet50", "mobilenet_v2"),
        default="resnet50",
        help="the model `bench train` trains (default resnet50; other benchmarks ignore it)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from unstall.bench import load, print_result, write_json
    from unstall.bench.registry import MissingDependencyError, explain, require

    console = Console(width=None if sys.stdout.isatty() else 120)
    try:
        require(args.name)
        module = load(args.name)
        params = inspect.signature(module.run).parameters
        extra = {"model": args.model} if "model" in params else {}
        if args.repeats is not None and "repeats" in params:
            extra["repeats"] = args.repeats
        if "scale" in params:
            extra.update(scale=args.scale, scale_gb=args.scale_gb)
        try:
            result = module.run(quick=args.quick, console=console, **extra)
        except ModuleNotFoundError as exc:  # one `NEEDS` does not list
            raise explain(args.name, exc) from exc
    except MissingDependencyError as exc:
        from rich.markup import escape

        err = Console(stderr=True)
        err.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    print_result(result, console)
    if args.json:
        write_json(result, args.json)
        console.print(f"wrote {args.json}")
    return 0
