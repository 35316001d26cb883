"""``unstall analyze``: where a training job's time goes, what would fix it, and the fix.

``unstall analyze --data DIR_OR_S3_URL --model resnet50 [--rate N]``: the built-in
workload; ``unstall analyze [OPTIONS] -- python train.py ARGS``: an unchanged script.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from unstall.cli.args import add_command, add_json, command_of


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "analyze",
        help="measure where training time goes (differential runs), predict fixes, recommend one",
        description=(
            "Runs the same steps of the same known order three ways: synthetic (the model "
            "alone: G), cached (the steps' samples in unstall's cache: prep stall) and cold "
            "(page cache evicted: fetch stall); reports the rates, stall shares, the "
            "bottleneck, a what-if table and a recommended configuration."
        ),
    )
    p.add_argument("--data", metavar="DIR_OR_URL", help="images (ImageFolder layout) or s3://...")
    p.add_argument("--model", default="resnet50", help="built-in workload's model (resnet50...)")
    p.add_argument(
        "--rate",
        type=float,
        help="simulated model rate in samples/s (default: the "
        "model's H100 rate without a GPU; the real model on a GPU)",
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, help="loader workers (default: cores available)")
    p.add_argument(
        "--steps",
        type=int,
        help="least measured steps per run (built-in workload: exactly; default 200, --quick "
        "30; a script: at least this many and --min-seconds of steady state, default 50, "
        "--quick 12)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        help="warm-up steps per run, after each loader's start-up burst (default 10, --quick 3)",
    )
    p.add_argument(
        "--min-seconds",
        type=float,
        help="a script's least seconds of steady state per run (default 20, --quick 4; "
        "half for the model alone)",
    )
    p.add_argument("--quick", action="store_true", help="shorter runs: an answer in a minute")
    p.add_argument(
        "--run-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="a script run still going after this long is stopped, with where each of its "
        "processes was (default 600)",
    )
    p.add_argument(
        "--verify",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the script once more under the recommendation (default: on without --quick)",
    )
    p.add_argument(
        "--what-if",
        metavar="SPEC",
        help='one question, e.g. "cache=0.5,workers=8,bandwidth=200MB/s,latency=20ms"',
    )
    add_json(p, "the report")
    p.add_argument(
        "--html",
        metavar="DIR",
        default="unstall-report",
        help="HTML report, PNGs, trace.json (default ./unstall-report)",
    )
    p.add_argument(
        "--config-out",
        metavar="FILE",
        help="write the recommendation here (default "
        "DIR/recommendation.json), for `unstall run --config FILE`",
    )
    add_command(p, "(script mode)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 100)
    command = command_of(args)
    if bool(command) == bool(args.data):
        console.print(
            "unstall analyze: give --data DIR_OR_URL (built-in workload) or a command after "
            "--, e.g. unstall analyze -- python train.py"
        )
        return 2
    # both modes take the run length and the report's options alike
    common = {
        "warmup": args.warmup,
        "steps": args.steps,
        "quick": args.quick,
        "what_if": args.what_if,
        "html_dir": args.html,
    }
    try:
        if command:
            from unstall.analysis.pipeline import analyze_script

            report = analyze_script(
                command,
                console=console,
                min_s=args.min_seconds,
                verify=args.verify,
                run_timeout_s=args.run_timeout,
                **common,
            )
        else:
            report = _builtin(args, console, common)
    except (ValueError, FileNotFoundError, TimeoutError) as exc:
        from rich.markup import escape

        console.print(f"unstall analyze: {escape(str(exc))}")
        return 2
    from unstall.analysis.report.terminal import print_summary

    print_summary(report, console)
    config_path = args.config_out or os.path.join(args.html, "recommendation.json")
    with open(config_path, "w") as f:
        json.dump(
            {"kwargs": report["recommendation"]["kwargs"], "predicted": report["recommendation"]},
            f,
            indent=2,
        )
    console.print(f"report: {report['html']}  timeline: {report['trace']}  config: {config_path}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        console.print(f"wrote {args.json}")
    return 0


def _builtin(args: argparse.Namespace, console, common: dict) -> dict:
    from unstall.analysis.pipeline import analyze
    from unstall.analysis.progress import progress_bar

    with progress_bar(console) as bar:
        task = bar.add_task("starting", total=5)

        def progress(msg: str) -> None:
            bar.update(task, description=msg, advance=1)

        return analyze(
            args.data,
            model=args.model,
            rate=args.rate,
            batch_size=args.batch_size,
            num_workers=args.workers,
            progress=progress,
            **common,
        )
