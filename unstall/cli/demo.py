"""`unstall demo`: where does training time go, and what does switching loaders change?

Makes (once) a small synthetic JPEG dataset, then trains a simulated model on it
three ways, side by side in the same run: torch's DataLoader with the usual
float32 PIL pipeline, unstall's DataLoader with that same pipeline, and unstall
with its own fast pipeline. Prints compute time, data stall and the ratio.
"""

from __future__ import annotations

import argparse
import sys

from unstall import machine


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="show data stalls on built-in synthetic data: torch vs unstall (about a minute)",
        description="Make a small synthetic dataset (cached), train a simulated accelerator on "
        "it with torch's DataLoader and with unstall, and show where the time went.",
    )
    p.add_argument("--images", type=int, default=1024, help="dataset size (default 1024)")
    p.add_argument(
        "--rate",
        type=float,
        default=4000.0,
        help="simulated accelerator speed in samples/s (default 4000: ResNet-50 on one H100)",
    )
    p.add_argument(
        "--workers", type=int, default=None, help="loader worker processes (default: CPU count)"
    )
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3, help="interleaved runs; the median is shown")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from unstall.bench.harness import measure, median_of
    from unstall.bench.local import PerSample
    from unstall.data import ImageFolder
    from unstall.data.synthetic import ensure_demo_dataset
    from unstall.loader import DataLoader
    from unstall.pipeline import ImagePipeline, TorchReferencePipeline

    if args.rounds < 1:
        raise SystemExit(f"--rounds={args.rounds} must be >= 1")
    if args.images < args.batch_size:
        raise SystemExit(f"--images={args.images} must be >= --batch-size={args.batch_size}")
    console = Console(width=None if sys.stdout.isatty() else 100)
    workers = args.workers if args.workers is not None else machine.cores_available()
    console.print(
        f"[bold]unstall demo[/bold]: {args.images} synthetic JPEGs, {workers} workers, "
        f"simulated accelerator at {args.rate:,.0f} samples/s"
    )
    root = ensure_demo_dataset(images=args.images, classes=10, seed=0)
    console.print(f"dataset: {root}")

    reference = ImageFolder(root, transform=TorchReferencePipeline())
    fast = ImageFolder(root, transform=ImagePipeline())
    bs = args.batch_size
    runs = {
        "torch + float32 PIL pipeline": lambda: torch.utils.data.DataLoader(
            PerSample(reference), batch_size=bs, shuffle=True, num_workers=workers
        ),
        "unstall + same pipeline": lambda: DataLoader(
            reference, batch_size=bs, shuffle=True, num_workers=workers
        ),
        "unstall + its pipeline": lambda: DataLoader(
            fast, batch_size=bs, shuffle=True, num_workers=workers
        ),
    }
    rounds: dict[str, list] = {name: [] for name in runs}
    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        tasks = {name: progress.add_task(name, total=args.rounds * args.images) for name in runs}
        for _ in range(args.rounds):  # interleaved rounds: noise on a busy machine hits all alike
            for name, make in runs.items():
                task = tasks[name]
                rounds[name].append(
                    measure(
                        make(), rate=args.rate, on_batch=lambda n, t=task: progress.advance(t, n)
                    )
                )
    results = {name: median_of(ms) for name, ms in rounds.items()}

    base = next(iter(results.values()))
    table = Table(title=f"where the time went (one epoch, median of {args.rounds} rounds)")
    for col in ("loader", "samples/s", "compute s", "data stall s", "stall %", "speed-up"):
        table.add_column(col, justify="left" if col == "loader" else "right")
    for name, m in results.items():
        table.add_row(
            name,
            f"{m.samples_per_s:,.0f}",
            f"{m.compute_s:.2f}",
            f"{m.wall_s - m.compute_s:.2f}",
            f"{100 * m.stall_fraction:.0f} %",
            f"{m.samples_per_s / base.samples_per_s:.2f}x",
        )
    console.print(table)
    best = list(results.values())[-1]
    console.print(
        f"With torch's DataLoader the accelerator waited {100 * base.stall_fraction:.0f} % of "
        f"the time; with unstall {100 * best.stall_fraction:.0f} %: "
        f"[bold]{best.samples_per_s / base.samples_per_s:.2f}x[/bold] the training speed."
    )
    console.print(
        f"This machine prepares images on {machine.cores_available()} cores; a stall that "
        "remains is preparation-bound: more cores, GPU decode, or `unstall bench prep` show "
        "what helps. Try `unstall bench local`."
    )
    return 0
