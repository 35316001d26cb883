"""`unstall index URL`: index a sharded dataset ahead of training, and keep the index beside it.

Each shard's index (tar headers, MDS offset tables, Parquet footers) is built,
saved locally as each shard completes (an interrupted run resumes where it
stopped), and written beside the shards as ``<URL>/_unstall_index/<format>/
<shard>.npz``. Any node that then makes the dataset reads these small objects
(one GET each, all in flight) instead of the shards: its first batch needs only
the shards that batch reads.
"""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    from unstall.data.shards.registry import KINDS

    kinds = ", ".join(KINDS)
    p = sub.add_parser(
        "index",
        help=f"index sharded data ({kinds}) ahead of training; keep it beside the shards",
        description="Build the index of every shard under URL (a directory, an s3:// prefix, "
        "or a brace pattern such as s3://b/train-{000000..000999}.tar) and write it beside the "
        "shards (_unstall_index/), so training on any node reads no shard to index it. Shards "
        "already indexed (locally or beside them) at their current version are not read.",
    )
    p.add_argument("url", metavar="URL", help="the shards: directory, s3:// prefix or pattern")
    p.add_argument(
        "--format", default=None, metavar="FORMAT",
        help=f"shard format: {kinds} (default: from the URL's suffix; mds when an index.json "
        "is named)",
    )  # fmt: skip
    p.add_argument("--endpoint", default=None, help="S3-compatible endpoint URL (http://host:port)")
    p.add_argument(
        "--local-only", action="store_true",
        help="keep the index on this node only ($UNSTALL_CACHE_DIR/shards/index); write nothing "
        "beside the shards",
    )  # fmt: skip
    p.add_argument(
        "--keep-copies", action="store_true",
        help="keep the downloaded shards on this node's disk for training here (default: each "
        "shard is deleted once indexed)",
    )  # fmt: skip
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import time

    from rich.console import Console

    from unstall.data.shards.registry import format_for, formats

    console = Console()
    kind = args.format or format_for(args.url)
    table = formats()  # checked here, not by argparse: the formats' classes import torch
    if kind not in table:
        Console(stderr=True).print(
            f"[red]error:[/red] --format {kind}: not a shard format (one of {', '.join(table)})",
            highlight=False,
        )
        return 2
    cls = table[kind]
    options = {"endpoint": args.endpoint} if args.endpoint else {}
    t0 = time.perf_counter()
    try:
        ds = cls(
            args.url, image=None, label=None, disk="auto" if args.keep_copies else 0, **options
        )
        ds.complete()  # kept copies: the shards land in the background; wait for every one
    except (ValueError, OSError) as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        return 2
    built_s = time.perf_counter() - t0
    sources = ds.stats()["shards"]["index"]
    written = 0 if args.local_only else ds.publish_index()
    where = "this node only" if args.local_only else f"{ds.location.url}/_unstall_index/{kind}/"
    console.print(
        f"{len(ds.index.shards):,} {kind} shards, {len(ds):,} samples indexed in {built_s:.1f} s "
        f"({sources['built']} read now, {sources['local']} indexed on this node, "
        f"{sources['beside']} beside the shards); {written} index objects written to {where}",
        highlight=False,
        soft_wrap=True,
    )
    return 0
