"""Node-wide file locks (``flock``): a local copy of a remote object is written by one process.

Workers, jobs and ranks of a node that want the same object take the lock beside
its destination file: one writes the file, the others wait and then find it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os


def try_lock(path: str) -> int | None:
    """An open descriptor of ``path`` holding its exclusive ``flock``, or None when another
    process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def lock(path: str) -> int:
    """An open descriptor of ``path`` holding its exclusive ``flock``; waits for it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlock(fd: int) -> None:
    """Release and close a descriptor from `lock` / `try_lock`."""
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
