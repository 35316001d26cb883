"""`unstall make-dataset DIR`: write a synthetic ImageFolder dataset of realistic JPEGs."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "make-dataset",
        help="write a synthetic ImageFolder dataset of ~500x375, ~75 KB JPEGs",
        description="Write IMAGES synthetic JPEGs (class_XXX/img_XXXXXX.jpg) to DIR, a directory "
        "or a storage URL. The same seed gives the same bytes; re-running into the same "
        "directory with the same parameters only writes what is missing.",
    )
    p.add_argument("dir", metavar="DIR", help="destination directory or URL (s3://bucket/prefix)")
    p.add_argument("--images", type=int, required=True, help="number of images")
    p.add_argument("--classes", type=int, required=True, help="number of classes (folders)")
    p.add_argument("--seed", type=int, default=0, help="content seed (default: 0)")
    p.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    p.add_argument("--quality", type=int, default=90, help="JPEG quality, 1-100 (default: 90)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from unstall.data.synthetic import make_dataset

    console = Console()
    try:
        info = make_dataset(
            args.dir,
            images=args.images,
            classes=args.classes,
            seed=args.seed,
            workers=args.workers,
            quality=args.quality,
            progress=not args.no_progress,
        )
    except ValueError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        return 2
    size = f"mean {info.mean_bytes / 1000:.1f} KB, " if info.sized else ""
    console.print(
        f"{info.images} images in {info.classes} classes at {info.root}: "
        f"{info.written} written, {info.skipped} already there; "
        f"{size}{info.total_bytes / 1e6:.1f} MB in {info.seconds:.1f} s",
        highlight=False,
        soft_wrap=True,
    )
    return 0
