"""`unstall cache list|clear`: show and remove the shared-memory cache segments on this node."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cache",
        help="list or remove shared-memory cache segments",
        description="Shared-memory segments of unstall.Cache on this node (in /dev/shm, or "
        "$UNSTALL_SHM_DIR): one per dataset, shared by all jobs of a user.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    ls = actions.add_parser("list", help="table of segments: capacity, use, live users")
    ls.add_argument("--all", action="store_true", help="every user's segments, not only mine")
    ls.set_defaults(run=run)
    clear = actions.add_parser("clear", help="remove segments no live process uses")
    clear.add_argument("name", nargs="?", help="one segment (default: all of mine)")
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
    from unstall.cache.segment import shm_dir

    console = Console()
    if args.action == "clear":
        removed = clear_caches(args.name, force=args.force)
        for name in removed:
            console.print(f"removed {name}")
        if args.name and not removed:
            console.print(
                f"segment {args.name!r} not removed: it does not exist in {shm_dir()} or a live "
                "process uses it (see `unstall cache list`; --force removes it anyway)"
            )
            return 1
        if not removed:
            console.print("nothing to remove")
        return 0
    from rich.table import Table

    rows = list_caches(everyone=getattr(args, "all", False))
    if not rows:
        console.print(f"no unstall cache segments in {shm_dir()}")
        return 0
    table = Table(title=f"unstall cache segments in {shm_dir()}")
    for col in ("name", "dataset", "policy", "capacity", "used", "items", "users alive"):
        left = col in ("name", "dataset", "policy")
        table.add_column(col, justify="left" if left else "right", overflow="fold")
    for r in rows:
        table.add_row(
            r["name"],
            r["fingerprint"][:16],
            r["policy"],
            format_bytes(r["capacity_bytes"]),
            f"{format_bytes(r['used_bytes'])} ({r['used_bytes'] / r['capacity_bytes']:.0%})",
            f"{r['items_cached']:,} / {r['items']:,}",
            ", ".join(map(str, r["users_alive"])) or "none (stale)",
        )
    console.print(table)
    return 0
