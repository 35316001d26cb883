"""Shared-memory segment files: their names, creation with reserved space, locking, liveness.

Every segment is a plain file in the shared-memory directory (`unstall.machine.shm_dir`:
``/dev/shm``, or ``$UNSTALL_SHM_DIR``), mapped with ``mmap``. We do not use
`multiprocessing.shared_memory`: its resource tracker unlinks segments when the
*first* process that attached exits, and cannot be told who the last user is.
Names come from `segment_name` only, with a per-user prefix (plus
``$UNSTALL_SHM_NAMESPACE`` when set, to keep CI jobs or tests apart).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
from collections.abc import Iterator

import psutil

from unstall.cache.shm.reaper import still_linked as still_linked  # the one same-file check
from unstall.machine import free_bytes as free_bytes  # segments' room, as the machine says
from unstall.machine import shm_dir, shm_namespace

#: Every unstall segment name starts with this, then the user id.
NAME_PREFIX = "unstall"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def name_prefix() -> str:
    """``unstall-u<uid>-`` (``unstall-u<uid>-<namespace>-`` with ``$UNSTALL_SHM_NAMESPACE``)."""
    namespace = _SAFE.sub("_", shm_namespace())
    head = f"{NAME_PREFIX}-u{os.getuid()}-"
    return f"{head}{namespace}-" if namespace else head


def segment_name(fingerprint: str, policy: str = "noevict", name: str | None = None) -> str:
    """The one place segment names are made: prefix + (``name`` or fingerprint) + policy tag.

    Jobs of the same user opening the same dataset get the same name, so they
    share one copy. The policy is part of the name because layouts differ.
    """
    tag = _SAFE.sub("_", name) if name else fingerprint[:24]
    suffix = "" if policy == "noevict" else f"-{policy}"
    return f"{name_prefix()}{tag}{suffix}"


def segment_path(name: str) -> str:
    return os.path.join(shm_dir(), name)


def list_segment_names(everyone: bool = False) -> list[str]:
    """Segments in `shm_dir` with this user's prefix (every unstall one if ``everyone``)."""
    prefix = f"{NAME_PREFIX}-" if everyone else name_prefix()
    try:
        names = os.listdir(shm_dir())
    except FileNotFoundError:
        return []
    return sorted(n for n in names if n.startswith(prefix) and not n.endswith(".tmp"))


def remove_dead_tmp_files() -> list[str]:
    """Remove half-created segments (``<name>.<pid>.tmp``) whose creator died; their names."""
    removed = []
    for name in os.listdir(shm_dir()):
        _head, _, rest = name.rpartition(".tmp")[0].rpartition(".")
        if not (name.startswith(name_prefix()) and name.endswith(".tmp") and rest.isdigit()):
            continue
        if not pid_alive(int(rest), 0):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(shm_dir(), name))
            removed.append(name)
    return removed


def create_file(path: str, size: int) -> int:
    """Create ``path.<pid>.tmp`` of ``size`` bytes with space reserved; returns its fd.

    ``posix_fallocate`` reserves the pages now, so a full tmpfs fails here with
    ``OSError(ENOSPC)`` instead of killing a worker with SIGBUS on first write.
    The caller initialises the file and publishes it with `publish_file`.
    """
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return fd


def publish_file(path: str) -> bool:
    """Give this process's initialised tmp file its final name; False if another won the race."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def discard_tmp(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{path}.{os.getpid()}.tmp")


@contextlib.contextmanager
def locked(fd: int) -> Iterator[None]:
    """Hold the segment's exclusive lock (``flock`` on its file).

    ``flock`` is released by the kernel when a holder dies, so a killed job never
    leaves the segment locked. Each process must use its own ``open`` of the file
    (a forked child shares the parent's lock otherwise). Entering and leaving are
    system calls, which also order memory (a full barrier) on every CPU.
    """
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def process_stamp(pid: int) -> int:
    """The start time of process ``pid`` in ms (0 if gone): tells a live pid from a reused one."""
    try:
        return int(psutil.Process(pid).create_time() * 1000)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return 0


def pid_alive(pid: int, stamp: int) -> bool:
    """True if ``pid`` runs, is not a zombie, and started at ``stamp`` (ms)."""
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return stamp == 0 or abs(int(proc.create_time() * 1000) - stamp) <= 10
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def is_no_space(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM, errno.EDQUOT)
