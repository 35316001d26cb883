"""Removes one kept segment when its time is up, though no unstall process runs by then.

Started by the last user of a segment that it keeps (`unstall.cache.shm.keep.start_reaper`)
as ``python -I reaper.py PATH``: a detached process of the standard library only (it
must not import torch with the ``unstall`` package), a few MB, that sleeps until the
segment's keep time, then removes it under the segment's lock if it is still kept.
It leaves as soon as the segment is gone or in use again (a job that takes a kept
segment clears its keep time; the next release starts a new reaper).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import sys
import time

# Must match unstall.cache.shm.index (tests/cache/test_versions.py checks it).
MAGIC = 0x554E5354414C4C31
VERSION = 2
H_MAGIC, H_VERSION, H_KEEP_UNTIL = 0, 1, 24
#: Longest sleep between looks at the segment [Unit: second].
POLL_S = 10.0


def _word(fd: int, index: int) -> int:
    raw = os.pread(fd, 8, index * 8)
    return struct.unpack("<q", raw)[0] if len(raw) == 8 else 0


def _kept_until(fd: int) -> int:
    """The segment's keep time, or 0 if it is in use or not a segment of this version."""
    if _word(fd, H_MAGIC) != struct.unpack("<q", struct.pack("<Q", MAGIC))[0]:
        return 0
    return _word(fd, H_KEEP_UNTIL) if _word(fd, H_VERSION) == VERSION else 0


def still_linked(fd: int, path: str) -> bool:
    """True if ``fd`` is still the file named ``path`` (not unlinked or replaced meanwhile).
    The one same-file check: `unstall.cache.shm.segment` takes it from here, since this
    module must run on the standard library alone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return mine.st_nlink > 0 and (mine.st_ino, mine.st_dev) == (st.st_ino, st.st_dev)


def reap(path: str, poll_s: float = POLL_S) -> bool:
    """Wait for ``path``'s keep time, then remove it if still kept; True if removed."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            until = _kept_until(fd)
            if until == 0:
                return False
            wait = until - time.time()
            if wait <= 0:
                fcntl.flock(fd, fcntl.LOCK_EX)
                until = _kept_until(fd)
                if until and until <= time.time() and still_linked(fd, path):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                    return True
                return False
        finally:
            os.close(fd)
        time.sleep(min(wait + 0.2, poll_s))


if __name__ == "__main__":
    reap(sys.argv[1])
