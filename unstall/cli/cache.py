"""`unstall cache list|clear`: show and remove the cache tiers on this node (RAM and disk)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="list or remove cache tiers (shared memory and local disk)",
        description="Tiers of unstall.Cache on this node: shared-memory segments (in /dev/shm, "
        "or $UNSTALL_SHM_DIR) and local-disk tiers (in $UNSTALL_CACHE_DIR/tiers, default "
        "~/.cache/unstall/tiers); one per dataset, shared by all jobs of a user; and whole "
        "remote shards copied by sharded datasets and their indexes ($UNSTALL_CACHE_DIR/shards).",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    ls = actions.add_parser("list", help="table of tiers: capacity, use, disk space, live users")
    ls.add_argument("--all", action="store_true", help="every user's segments, not only mine")
    ls.set_defaults(run=run)
    clear = actions.add_parser("clear", help="remove tiers no live process uses (both)")
    clear.add_argument(
        "name", nargs="?", help="one cache by name, both tiers (default: all of mine)"
    )
    clear.add_argument(
        "--force",
        action="store_true",
        help="also remove segments in use (their users keep their mapping; new jobs start "
        "a fresh segment)",
    )
    clear.set_defaults(run=run)
    p.set_defaults(run=run, action=None)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from unstall.cache import clear_caches, list_caches
    from unstall.cache.disk_tier import tier_dir
    from unstall.cache.shm.segment import shm_dir

    console = Console()
    if args.action == "clear":
        from unstall.data.shards.shard_files import clear_copies

        removed = clear_caches(args.name, force=args.force) + clear_copies(args.name)
        for name in removed:
            console.print(f"removed {name}")
        if args.name and not removed:
            console.print(
                f"cache {args.name!r} not removed: it is in neither {shm_dir()} nor {tier_dir()}, "
                "or a live "
                "process uses it (see `unstall cache list`; --force removes it anyway)"
            )
            return 1
        if not removed:
            console.print("nothing to remove")
        return 0
    from unstall.data.shards.shard_files import list_copies

    rows = list_caches(everyone=getattr(args, "all", False)) + list_copies()
    if not rows:
        console.print(f"no unstall cache segments in {shm_dir()} or {tier_dir()}")
        return 0
    console.print(_table(rows, f"unstall caches: RAM in {shm_dir()}, disk in {tier_dir()}"))
    return 0


def _table(rows: list[dict], title: str) -> Any:
    """The tiers as a table that fits 80 columns: a line of figures per tier, beside its name
    (what `unstall cache clear` takes, the one column that folds) and under that, dimmed, its
    dataset, policy and bytes on disk."""
    from rich.table import Table

    from unstall.cache.capacity import format_bytes

    table = Table(title=title, box=None, pad_edge=False, title_justify="left")
    table.add_column("tier", no_wrap=True)
    table.add_column("name", overflow="fold", ratio=1)
    table.add_column("used", justify="right", no_wrap=True)
    table.add_column("of", justify="right", no_wrap=True)
    table.add_column("items", justify="right")
    table.add_column("users", overflow="fold", max_width=11)
    for r in rows:
        if r["tier"] == "shards":  # whole remote shards copied by a sharded dataset
            disk = format_bytes(r["file_bytes"] + r["index_bytes"])  # copies + index files
            name = f"{r['location']}\n[dim]{r['indexes']:,} indexed, {disk} on disk[/dim]"
            items = f"{r['shards']:,} shards"
            table.add_row("shards", name, format_bytes(r["file_bytes"]), "-", items, "-")
            continue
        cap, used = r["capacity_bytes"], r["used_bytes"]
        about = f"{r.get('holds', 'bytes')}, {r['fingerprint'][:12]}, {r['policy']}"
        if r["tier"] == "disk":
            about += f", {format_bytes(r['file_bytes'])} on disk"
        table.add_row(
            r["tier"],
            f"{r['name']}\n[dim]{about}[/dim]",
            f"{format_bytes(used)} {used / max(cap, 1):.0%}",
            format_bytes(cap),
            f"{_count(r['items_cached'])} / {_count(r['items'])}",
            ", ".join(map(str, r["users_alive"])) or _no_user(r),
        )
    return table


def _count(n: int) -> str:
    """An item count in at most 5 characters: ``123``, ``12,345``... ``281k``, ``1.3M``."""
    if n < 100_000:
        return f"{n:,}"
    if n < 1_000_000:
        return f"{n // 1000}k"
    return f"{n / 1e6:.1f}M"


def _no_user(row: dict) -> str:
    """The "users alive" cell of a tier no live process uses."""
    if row["tier"] == "disk":
        return "none (kept)"
    until = row.get("kept_until", 0)
    if until:
        import time

        return f"none (kept until {time.strftime('%H:%M', time.localtime(until))})"
    return "none (dead job)"
