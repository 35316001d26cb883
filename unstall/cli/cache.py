"""`unstall cache list|clear`: show and remove the cache tiers on this node (RAM and disk)."""

from __future__ import annotations

import argparse


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
    from unstall.cache.capacity import format_bytes
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
    from rich.table import Table

    from unstall.data.shards.shard_files import list_copies

    rows = list_caches(everyone=getattr(args, "all", False)) + list_copies()
    if not rows:
        console.print(f"no unstall cache segments in {shm_dir()} or {tier_dir()}")
        return 0
    table = Table(title=f"unstall caches: RAM in {shm_dir()}, disk in {tier_dir()}")
    for col in ("tier", "name", "dataset", "policy", "capacity", "used", "items", "on disk",
                "users alive"):  # fmt: skip
        left = col in ("tier", "name", "dataset", "policy")
        table.add_column(col, justify="left" if left else "right", overflow="fold")
    for r in rows:
        if r["tier"] == "shards":  # whole remote shards copied by a sharded dataset
            size = format_bytes(r["file_bytes"])
            disk = format_bytes(r["file_bytes"] + r["index_bytes"])  # copies + index files
            items = f"{r['shards']:,} shards, {r['indexes']:,} indexed"
            table.add_row("shards", r["name"], r["location"], "-", "-", size, items, disk, "-")
            continue
        cap = r["capacity_bytes"]
        table.add_row(
            r["tier"],
            r["name"],
            r["fingerprint"][:16],
            r["policy"],
            format_bytes(cap),
            f"{format_bytes(r['used_bytes'])} ({r['used_bytes'] / max(cap, 1):.0%})",
            f"{r['items_cached']:,} / {r['items']:,}",
            format_bytes(r["file_bytes"]) if r["tier"] == "disk" else "-",
            ", ".join(map(str, r["users_alive"])) or _no_user(r),
        )
    console.print(table)
    return 0


def _no_user(row: dict) -> str:
    """The "users alive" cell of a tier no live process uses."""
    if row["tier"] == "disk":
        return "none (kept for the next job)"
    until = row.get("kept_until", 0)
    if until:
        import time

        return f"none (kept until {time.strftime('%H:%M:%S', time.localtime(until))})"
    return "none (left by a dead job)"
