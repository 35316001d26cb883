"""Which process's memory holds obstore's tokio runtime: it does not survive ``fork()``.

A process that forks after using obstore leaves its children a runtime that
hangs on their first request, whatever store they use. Every obstore user
(the S3 fetcher, the peer client) marks the process here first and checks
that no ancestor did.
"""

from __future__ import annotations

import os

_PID: int | None = None  # the process that used obstore, as this memory remembers it


def inherited() -> int | None:
    """The pid of an ancestor that used obstore (its runtime is unusable here), else None."""
    return _PID if _PID is not None and os.getpid() != _PID else None


def claim() -> None:
    """Mark this process as an obstore user (call before its first request)."""
    global _PID
    _PID = os.getpid()
