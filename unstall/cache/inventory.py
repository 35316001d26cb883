"""Every cache tier of this user on the node, for `unstall cache list` and `unstall cache clear`."""

from __future__ import annotations

from typing import Any

from unstall.cache import disk_files
from unstall.cache.shm import lifecycle, segment

#: What a segment holds, by the tag its name starts with (`unstall.cache.points`).
HELD = ("samples", "decoded")


def list_caches(everyone: bool = False) -> list[dict[str, Any]]:
    """One dict per RAM segment of this user (every user's with ``everyone``), then one per
    disk tier of this user: `unstall cache list`. ``holds`` says what each holds: ``bytes``
    (raw bytes or whole files), ``decoded`` or ``samples``."""
    out = []
    for name in segment.list_segment_names(everyone):
        info = lifecycle.describe(segment.segment_path(name))
        if info is not None:
            out.append({"tier": "ram", **info, "holds": holds_of(name)})
    for name in disk_files.list_names():
        info = disk_files.describe(disk_files.index_path(name))
        if info is not None:
            out.append({**info, "holds": holds_of(name)})
    return out


def holds_of(name: str) -> str:
    """What the segment (or disk tier) called ``name`` holds."""
    rest = name[len(segment.name_prefix()) :] if name.startswith(segment.name_prefix()) else name
    for held in HELD:
        if rest.startswith(f"{held}-") or f"-{held}-" in name:
            return held
    return "bytes"


def clear_caches(name: str | None = None, *, force: bool = False) -> list[str]:
    """Remove this user's segments (or the one named) that no live process uses; returns names."""
    names = segment.list_segment_names() if name is None else [name]
    removed = [n for n in names if lifecycle.remove(segment.segment_path(n), force=force)]
    disk_names = disk_files.list_names() if name is None else [name]
    removed += [f"{n} (disk)" for n in disk_names if disk_files.remove(n, force=force)]
    if name is None:
        removed += segment.remove_dead_tmp_files()
        removed += disk_files.remove_orphans()
    return removed
