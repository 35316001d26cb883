"""Kept segments: a RAM tier that outlives its last user, bounded by a time and by memory.

When the last job using a segment leaves, the segment stays in shared memory for
``keep`` seconds (`Cache(keep=...)`, else ``$UNSTALL_CACHE_KEEP_S``, default
`DEFAULT_KEEP_S`), so a job started after it hits from its first epoch. That is
safe because every item carries the version of its source (`unstall.cache.shm.index`):
a file changed in between is a miss, never served. Kept segments are released,
oldest first, by `sweep` (run on every `Cache.bind` and every release):

- when their time is up;
- while all kept segments together exceed ``$UNSTALL_CACHE_KEEP_MAX`` (a size or a
  fraction of RAM, default `DEFAULT_MAX_SHARE` of it);
- while the node's available memory is below `MIN_AVAILABLE_SHARE` of RAM, or the
  shared-memory directory lacks room for a segment about to be made.

and by a small detached process started at each release (`unstall.cache.shm.reaper`), so
the keep time holds even if no unstall process runs after. `unstall cache list`
shows them ("kept until ..."), `unstall cache clear` removes them.

A killed job's segment (SIGKILL, the OOM killer: no release ran, `lifecycle.abandoned`) has
no keep time. The next job of its dataset reclaims it, with its items. Until then it counts
against the same limits, and the sweep releases such segments first, before any kept one,
while the limits are crossed. Without that a killed job's segment held its RAM until someone
ran `unstall cache clear`: the OOM killer's victims are the jobs with the most to leave.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from unstall import machine
from unstall.cache.capacity import parse_capacity
from unstall.cache.shm import lifecycle, segment
from unstall.cache.shm.index import H_KEEP_UNTIL, H_LEFT_AT, ShmCache

#: Seconds a segment is kept after its last user leaves, unless told otherwise.
DEFAULT_KEEP_S = 3600.0
#: Kept segments together may hold at most this share of the node's RAM by default.
DEFAULT_MAX_SHARE = 0.25
#: Kept segments are released while available memory is below this share of RAM.
MIN_AVAILABLE_SHARE = 0.10


def keep_seconds(keep: float | None = None) -> float:
    """The keep time: ``keep`` if given, else ``$UNSTALL_CACHE_KEEP_S``, else the default.

    Raises:
        ValueError: naming the setting, when it is negative or not a number.
    """
    if keep is None:
        text = machine.cache_keep_text()
        if not text:
            return DEFAULT_KEEP_S
        try:
            keep = float(text)
        except ValueError:
            raise ValueError(
                f"UNSTALL_CACHE_KEEP_S={text!r} must be seconds (0 removes a segment when "
                "its last user leaves)"
            ) from None
    if isinstance(keep, bool) or not isinstance(keep, int | float) or not keep >= 0:
        raise ValueError(
            f"keep={keep!r} must be seconds >= 0 (0 removes a segment when its last user leaves)"
        )
    return float(keep)


def max_kept_bytes() -> int:
    """``$UNSTALL_CACHE_KEEP_MAX`` (bytes, a size string or a fraction of RAM) in bytes."""
    total = machine.memory_total_bytes()
    text = machine.cache_keep_max_text()
    if not text:
        return int(total * DEFAULT_MAX_SHARE)
    try:
        value = parse_capacity(float(text) if "." in text and text[0] in "0." else text)
    except ValueError as exc:
        raise ValueError(f"UNSTALL_CACHE_KEEP_MAX={text!r}: {exc}") from None
    return int(value * total) if isinstance(value, float) else int(value)


def idle_segments() -> list[dict[str, Any]]:
    """This user's segments no live process uses: the kept ones (a keep time set) and killed
    jobs' (`lifecycle.abandoned`, ``abandoned`` True), oldest first by when they were left."""
    out = []
    for name in segment.list_segment_names():
        path = segment.segment_path(name)
        cache = lifecycle.map_file(path, skip=(FileNotFoundError, PermissionError))
        if not isinstance(cache, ShmCache):
            continue
        try:
            if not cache.valid():
                continue
            dead = lifecycle.abandoned(cache)
            if dead or lifecycle.kept(cache):
                size = os.fstat(cache.fd).st_blocks * 512
                until, left = int(cache.hdr[H_KEEP_UNTIL]), int(cache.hdr[H_LEFT_AT])
                out.append(dict(name=name, until=until, left=left, size=size, abandoned=dead))
        finally:
            cache.close()
    return sorted(out, key=lambda k: (k["left"], k["name"]))


def kept_segments() -> list[dict[str, Any]]:
    """This user's kept segments (no live user, a keep time set), oldest first."""
    return [k for k in idle_segments() if not k["abandoned"]]


def sweep(*, need_bytes: int = 0, now: float | None = None) -> list[str]:
    """Release kept segments that expired, then, while over the limits (see the module
    notes), killed jobs' segments and then kept ones, oldest first; ``need_bytes``: shared
    memory wanted for a new segment. Returns the names released."""
    now = time.time() if now is None else now
    idle = idle_segments()
    if not idle:
        return []
    kept = [k for k in idle if not k["abandoned"]]
    released = [k for k in kept if k["until"] <= now]
    # a killed job's segment has no keep time: it goes first when room is wanted
    live = [k for k in idle if k["abandoned"]] + [k for k in kept if k["until"] > now]
    cap = max_kept_bytes()
    floor = machine.memory_total_bytes() * MIN_AVAILABLE_SHARE
    total = sum(k["size"] for k in live)
    shm_free = segment.free_bytes(segment.shm_dir())
    available = machine.memory_available_bytes()
    if available is None:  # not known here: memory is not what releases them
        available = floor
    while live and (total > cap or available < floor or shm_free < need_bytes):
        oldest = live.pop(0)
        released.append(oldest)
        total -= oldest["size"]
        shm_free += oldest["size"]
        available += oldest["size"]
    return [
        k["name"]
        for k in released
        if lifecycle.remove(  # a job may have taken it meanwhile
            segment.segment_path(k["name"]), only="abandoned" if k["abandoned"] else "kept"
        )
    ]


def start_reaper(path: str) -> None:
    """Start the process that removes the kept segment at ``path`` when its time is up."""
    import subprocess
    import sys

    from unstall.cache.shm import reaper

    with contextlib.suppress(OSError):  # no process to spare: the next bind's sweep does it
        subprocess.Popen(
            [sys.executable, "-I", reaper.__file__, path],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
