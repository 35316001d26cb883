"""Who uses a segment: open-or-create, per-process slots, reclaiming dead jobs' segments, removal.

Each process that touches a segment holds a *slot* in its header (pid, owner pid,
group, counters). An *owner* is a process that called `Cache.bind` (pid ==
owner); its loader's workers hold slots with that owner and the same *group*
(one random id per bind), so the owner can sum its loader's hits and misses.
A segment's users are its live owners. The last owner to close either removes
the file or, with a keep time (`Cache(keep=...)`, ``$UNSTALL_CACHE_KEEP_S``),
leaves it *kept* until then, so the next job of the same dataset hits from its
first epoch (every item carries its source's version, so nothing stale is
served); `unstall.cache.shm.keep` releases kept segments when they expire or memory
is needed. A segment whose owners are all dead (SIGKILL, OOM), or a kept one, is
reclaimed by the next process that opens it: reused if it holds the same dataset
and capacity, else replaced.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Literal

import numpy as np

from unstall.cache.shm import segment
from unstall.cache.shm.index import (
    CLAIMED,
    EMPTY,
    H_CACHED_ITEMS,
    H_CAPACITY,
    H_FP0,
    H_FP1,
    H_KEEP_UNTIL,
    H_LEFT_AT,
    H_RECLAIMS,
    H_STALE_BYTES,
    S_BYTES,
    S_GROUP,
    S_HITS,
    S_INSERTED,
    S_MISSES,
    S_OWNER,
    S_PID,
    S_STALE,
    S_STAMP,
    SLOTS,
    Layout,
    ShmCache,
)


class SegmentBusyError(RuntimeError):
    """A segment of this name is in use for another dataset or layout."""


def open_or_create(
    path: str, layout: Layout, fingerprint: str, dataset_bytes: int, *, group: int
) -> tuple[ShmCache, int, str]:
    """Map the segment at ``path`` (creating it if needed) and take an owner slot.

    Returns ``(cache, slot, how)`` with ``how`` one of ``"created"``, ``"attached"``
    (live users share it), ``"kept"`` (one kept after its last user left, reused with
    its contents), ``"reclaimed"`` (a dead job's segment, reused with its contents).
    Raises ``OSError`` (ENOSPC) when space cannot be reserved.
    """
    pid = os.getpid()
    stamp = segment.process_stamp(pid)
    for _attempt in range(50):
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            fd = segment.create_file(path, layout.file_size)
            try:
                cache = ShmCache(fd, path)
                cache.init_header(layout, fingerprint, dataset_bytes)
                slot = claim_slot(cache, pid=pid, owner=pid, group=group, stamp=stamp)
            except BaseException:
                os.close(fd)
                segment.discard_tmp(path)
                raise
            if segment.publish_file(path):
                return cache, slot, "created"
            cache.close()
            continue
        try:
            cache = ShmCache(fd, path)
        except ValueError:  # not a segment (truncated or foreign file under our prefix)
            os.close(fd)
            _unlink(path)
            continue
        how, busy = "", []
        with segment.locked(fd):
            if not segment.still_linked(fd, path):
                pass  # removed or replaced meanwhile: retry
            elif not alive_owners(cache):
                if _reusable(cache, layout, fingerprint):
                    how = "kept" if int(cache.hdr[H_KEEP_UNTIL]) else "reclaimed"
                    _reset_after_crash(cache)
                else:
                    _unlink(path)  # another dataset's or size's, unused: replaced
            elif not cache.matches(layout, fingerprint):
                busy = alive_owners(cache)
            else:
                how = "attached"
            if how:
                slot = claim_slot(cache, pid=pid, owner=pid, group=group, stamp=stamp)
                return cache, slot, how
        cache.close()
        if busy:
            raise SegmentBusyError(
                f"shared-memory segment {path!r} is in use by pids {busy} for another "
                "dataset or policy; pass `Cache(..., name=...)` with another name"
            )
    raise RuntimeError(f"could not open shared-memory segment {path!r} after 50 attempts")


def attach(path: str, *, owner: int, group: int) -> tuple[ShmCache, int] | None:
    """Map an existing segment from a worker (after fork); None if it is gone."""
    cache = map_file(path)
    if not isinstance(cache, ShmCache):
        return None
    if not cache.valid():
        cache.close()
        return None
    pid = os.getpid()
    stamp = segment.process_stamp(pid)
    with segment.locked(cache.fd):
        slot = claim_slot(cache, pid=pid, owner=owner, group=group, stamp=stamp)
    return cache, slot


def claim_slot(cache: ShmCache, *, pid: int, owner: int, group: int, stamp: int) -> int:
    """A slot for this process (lock held, or file unpublished); -1 if all are taken.

    Preference: this pid's slot in the group; a dead worker's slot of the same group
    (its counters carry on, so slots do not run out over many epochs); a free slot;
    a slot of a group whose owner is dead (cleared).
    """
    s = cache.slots
    pids, groups = s[:, S_PID], s[:, S_GROUP]
    mine = np.flatnonzero((pids == pid) & (groups == group))
    if len(mine):
        return int(mine[0])
    choice = -1
    for k in np.flatnonzero((groups == group) & (pids != s[:, S_OWNER])):
        if not segment.pid_alive(int(pids[k]), int(s[k, S_STAMP])):
            choice = int(k)
            break
    if choice < 0:
        free = np.flatnonzero(pids == 0)
        if len(free):
            choice = int(free[0])
            s[choice] = 0
    if choice < 0:
        for k in range(SLOTS):
            own = int(s[k, S_OWNER])
            if not segment.pid_alive(own, _owner_stamp(cache, own)):
                choice = k
                s[choice] = 0
                break
    if choice >= 0:
        s[choice, S_OWNER], s[choice, S_GROUP], s[choice, S_STAMP] = owner, group, stamp
        s[choice, S_PID] = pid
    return choice


def _owner_stamp(cache: ShmCache, owner: int) -> int:
    s = cache.slots
    rows = np.flatnonzero((s[:, S_PID] == owner) & (s[:, S_OWNER] == owner))
    return int(s[rows[0], S_STAMP]) if len(rows) else 0


def alive_owners(cache: ShmCache) -> list[int]:
    """Pids of the live processes that bound this segment (its users)."""
    s = cache.slots
    rows = np.flatnonzero((s[:, S_PID] != 0) & (s[:, S_PID] == s[:, S_OWNER]))
    return sorted(
        {int(s[k, S_PID]) for k in rows if segment.pid_alive(int(s[k, S_PID]), int(s[k, S_STAMP]))}
    )


def kept(cache: ShmCache) -> bool:
    """A kept segment: its last owner left it with a keep time, and no job has taken it since."""
    return int(cache.hdr[H_KEEP_UNTIL]) != 0 and not alive_owners(cache)


def abandoned(cache: ShmCache) -> bool:
    """A killed job's segment: bound once (an owner's slot is still there: no owner closed it),
    by owners all dead now (SIGKILL, the OOM killer), and not kept. A segment is published
    only after its creator's slot is claimed, so one being made is never taken for it."""
    s = cache.slots
    owned = bool(np.any((s[:, S_PID] != 0) & (s[:, S_PID] == s[:, S_OWNER])))
    return owned and not int(cache.hdr[H_KEEP_UNTIL]) and not alive_owners(cache)


def _reusable(cache: ShmCache, layout: Layout, fingerprint: str) -> bool:
    """Same dataset and size, and not paged: a dead holder of an evicting (paged) segment's
    lock may have left its page chains torn, so such a segment is replaced."""
    return (
        cache.matches(layout, fingerprint)
        and not layout.page_size
        and int(cache.hdr[H_CAPACITY]) == layout.capacity
    )


def _reset_after_crash(cache: ShmCache) -> None:
    """Forget dead processes: free their slots, drop items they claimed but never published."""
    kept = int(cache.hdr[H_KEEP_UNTIL]) != 0
    cache.slots[:] = 0
    cache.hdr[H_KEEP_UNTIL] = 0  # in use again
    claimed = cache.state == CLAIMED
    cache.state[claimed] = EMPTY  # their bytes stay allocated (lost), never visible
    if not kept:
        cache.hdr[H_RECLAIMS] += 1


#: A bind's counters, in slot-column order (`S_HITS`, `S_MISSES`, `S_INSERTED`, `S_BYTES`,
#: `S_STALE`: misses of items cached under another version of their source).
COUNTERS = ("hits", "misses", "inserted", "inserted_bytes", "stale")
_COLUMNS = (S_HITS, S_MISSES, S_INSERTED, S_BYTES, S_STALE)


def group_counts(cache: ShmCache, group: int, plus: dict[str, int] | None = None) -> dict[str, int]:
    """Hits, misses and inserts summed over the slots of one bind (owner and its workers).

    ``plus``: counts kept outside the segment (a process with no slot), added in.
    """
    s = cache.slots
    rows = s[s[:, S_GROUP] == group]
    counts = {key: int(rows[:, col].sum()) for key, col in zip(COUNTERS, _COLUMNS, strict=True)}
    for key, value in (plus or {}).items():
        counts[key] += value
    return counts


def add_counts(
    cache: ShmCache | None,
    slot: int,
    local: dict[str, int],
    hits: int,
    misses: int,
    inserted: int,
    size: int,
    stale: int = 0,
) -> None:
    """Add one fetch's counts to this process's slot of ``cache``, or to ``local`` where it has
    none (no segment mapped, or no free slot)."""
    counts = (hits, misses, inserted, size, stale)
    if cache is not None and slot >= 0:
        row = cache.slots[slot]  # this process is its slot's only writer
        with cache.thread_lock:
            for col, value in zip(_COLUMNS, counts, strict=True):
                row[col] += value
    else:
        for key, value in zip(COUNTERS, counts, strict=True):
            local[key] += value


def release(cache: ShmCache, *, group: int, keep_s: float = 0.0) -> bool:
    """An owner leaves: free its group's slots. If no live owner remains, remove the file,
    or with ``keep_s > 0`` keep it that many seconds for the next job. True if removed."""
    import time

    removed = False
    with cache.locked():
        cache.slots[cache.slots[:, S_GROUP] == group] = 0
        if segment.still_linked(cache.fd, cache.path) and not alive_owners(cache):
            now = time.time()
            cache.hdr[H_LEFT_AT] = time.time_ns()
            if keep_s > 0 and cache.valid():
                cache.state[cache.state == CLAIMED] = EMPTY  # none of ours is in flight now
                cache.hdr[H_KEEP_UNTIL] = max(1, int(now + keep_s))
            else:
                _unlink(cache.path)
                removed = True
    cache.close()
    return removed


def describe(path: str) -> dict[str, Any] | None:
    """What `unstall cache list` shows for one segment; None if it is not a valid one."""
    cache = map_file(path, skip=(FileNotFoundError, PermissionError))
    if not isinstance(cache, ShmCache):
        return None
    try:
        if not cache.valid():
            return None
        fp = np.array([cache.hdr[H_FP0], cache.hdr[H_FP1]], dtype=np.int64).tobytes().hex()
        return {
            "name": os.path.basename(path),
            "fingerprint": fp,
            "policy": cache.layout.policy,
            "capacity_bytes": cache.layout.capacity,
            "used_bytes": cache.used_bytes(),
            "items_cached": int(cache.hdr[H_CACHED_ITEMS]),
            "items": cache.layout.n_items,
            "file_bytes": os.fstat(cache.fd).st_size,
            "users_alive": alive_owners(cache),
            "kept_until": int(cache.hdr[H_KEEP_UNTIL]),
            "stale_bytes": int(cache.hdr[H_STALE_BYTES]),
        }
    finally:
        cache.close()


def remove(
    path: str, *, force: bool = False, only: Literal["kept", "abandoned"] | None = None
) -> bool:
    """Remove the segment at ``path`` if no live process uses it (or anyway with ``force``);
    True if removed. The one removal of a segment by name (`unstall cache clear`, and
    `unstall.cache.shm.keep` releasing a kept one or a killed job's with ``only``: only if
    it is still that (`kept`, `abandoned`) and the same file; a file that is not a segment
    is left then).
    """
    cache = map_file(path)
    if cache == "missing":
        return False
    if cache == "foreign":  # not a segment: a truncated file under our prefix
        if only:
            return False
        _unlink(path)
        return True
    try:
        with segment.locked(cache.fd):
            if only:
                still = kept(cache) if only == "kept" else cache.valid() and abandoned(cache)
                if not still or not segment.still_linked(cache.fd, path):
                    return False
            elif cache.valid() and alive_owners(cache) and not force:
                return False
            _unlink(path)
            return True
    finally:
        cache.close()


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def map_file(
    path: str, *, skip: tuple[type[OSError], ...] = (FileNotFoundError,)
) -> ShmCache | Literal["missing", "foreign"]:
    """Map the file at ``path``: the segment, ``"missing"`` (an error in ``skip`` on open, or
    a directory: e.g. a coordination group's, never a segment, never removed here) or
    ``"foreign"`` (not a segment: too short, or another layout's header)."""
    try:
        fd = os.open(path, os.O_RDWR)
    except (IsADirectoryError, *skip):
        return "missing"
    try:
        return ShmCache(fd, path)
    except ValueError:
        os.close(fd)
        return "foreign"
