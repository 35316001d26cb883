"""Whole remote shards kept on local disk, fetched once per node, read with ``pread``.

The disk tier of a sharded dataset: one file per shard under
``$UNSTALL_CACHE_DIR/shards/files/<location>/``, named by the shard's key and
version, so a rewritten shard is a new file and the old one is removed. A file
appears only when complete (written as ``.part``, then renamed). Workers and jobs
of a node that need the same shard take its ``flock``: one downloads, the others
wait for the file, so each shard is fetched once.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
from collections.abc import Iterable
from typing import Any

from unstall.cache.disk_tier import cache_dir
from unstall.data.shards.index import ShardInfo

LOCATION_FILE = "location.txt"


def files_root() -> str:
    """Where every location's shard copies are: ``$UNSTALL_CACHE_DIR/shards/files``."""
    return os.path.join(cache_dir(), "shards", "files")


class ShardFiles:
    """The local copies of one location's shards."""

    def __init__(self, location_url: str, directory: str | None = None):
        digest = hashlib.blake2b(location_url.encode(), digest_size=12).hexdigest()
        self.dir = directory or os.path.join(files_root(), digest)
        os.makedirs(self.dir, exist_ok=True)
        named = os.path.join(self.dir, LOCATION_FILE)
        if not os.path.exists(named):  # what these copies are of, for `unstall cache list`
            with contextlib.suppress(OSError):
                tmp = f"{named}.{os.getpid()}.tmp"
                with open(tmp, "w") as f:
                    f.write(location_url)
                os.replace(tmp, named)
        self._fds: dict[str, tuple[int, int]] = {}
        self.downloaded = 0  # shards this process fetched

    def path(self, info: ShardInfo) -> str:
        """The local file of ``info``'s shard at its version."""
        name = hashlib.blake2b(info.key.encode(), digest_size=10).hexdigest()
        version = hashlib.blake2b(f"{info.size}:{info.version}".encode(), digest_size=6)
        return os.path.join(self.dir, f"{name}-{version.hexdigest()}")

    def have(self, info: ShardInfo) -> bool:
        return os.path.exists(self.path(info))

    def held_bytes(self) -> int:
        """Bytes of the complete shard files here."""
        return _complete(self.dir)[0]

    def remove_stale(self, shards: Iterable[ShardInfo]) -> None:
        """Delete files of other versions of these shards (they were rewritten)."""
        current = {os.path.basename(self.path(s)) for s in shards}
        prefixes = {name.split("-", 1)[0] for name in current}
        with os.scandir(self.dir) as it:
            for entry in it:
                base = entry.name.split(".", 1)[0]
                if base.split("-", 1)[0] in prefixes and base not in current:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)

    def ensure(self, location: Any, infos: list[ShardInfo], then: Any = None) -> dict[str, Any]:
        """Make every shard of ``infos`` present locally, downloading each at most once per node.

        Shards no other process is fetching are downloaded together (all in flight);
        then this waits for the ones others are fetching (and fetches any they failed to).
        Returns ``then(path, key)`` of each shard this call downloaded, by key.
        """
        done: dict[str, Any] = {}
        missing = [i for i in dict.fromkeys(infos) if not self.have(i)]
        if not missing:
            return done
        ours: list[tuple[ShardInfo, int]] = []
        theirs: list[ShardInfo] = []
        try:
            for info in missing:
                fd = _try_lock(self.path(info) + ".lock")
                if fd is None:  # another process is downloading it
                    theirs.append(info)
                    continue
                if self.have(info):
                    _unlock(fd)
                else:
                    ours.append((info, fd))
            results = location.download([(info, self.path(info)) for info, _ in ours], then)
            done.update((info.key, r) for (info, _), r in zip(ours, results, strict=True))
            self.downloaded += len(ours)
        finally:
            for _, fd in ours:
                _unlock(fd)
        for info in theirs:
            fd = os.open(self.path(info) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                if not self.have(info):  # the other process failed: fetch it here
                    done[info.key] = location.download([(info, self.path(info))], then)[0]
                    self.downloaded += 1
            finally:
                _unlock(fd)
        return done

    def evict(self, budget: int, keep: list[ShardInfo]) -> int:
        """Delete the oldest copies (by download time) beyond ``budget`` bytes, never ``keep``'s.

        A process reading an evicted copy keeps its descriptor (the data stays until
        closed); one that needs it again downloads it again. Returns the files removed.
        """
        entries = []
        with os.scandir(self.dir) as it:
            for entry in it:
                if "." not in entry.name:
                    with contextlib.suppress(OSError):
                        st = entry.stat()
                        entries.append((st.st_mtime_ns, st.st_size, entry.path))
        total = sum(size for _, size, _ in entries)
        if total <= budget:
            return 0
        protected = {self.path(i) for i in keep}
        removed = 0
        for _, size, path in sorted(entries):
            if total <= budget:
                break
            if path in protected:
                continue
            with contextlib.suppress(OSError):
                os.unlink(path)
                total -= size
                removed += 1
        return removed

    def pread(self, info: ShardInfo, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the local copy of ``info``'s shard."""
        pid = os.getpid()
        got = self._fds.get(info.key)
        if got is None or got[1] != pid:
            got = (os.open(self.path(info), os.O_RDONLY), pid)
            self._fds[info.key] = got
        return os.pread(got[0], end - start, start)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fds"] = {}
        return state


def _try_lock(path: str) -> int | None:
    """An open descriptor of ``path`` holding its exclusive ``flock``, or None when another
    process holds it (downloading that shard)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _unlock(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _complete(directory: str) -> tuple[int, int]:
    """(bytes, count) of the complete shard files in ``directory`` (no ``.part``/``.lock``)."""
    total = count = 0
    with os.scandir(directory) as it:
        for entry in it:
            if "." not in entry.name:
                with contextlib.suppress(OSError):
                    total += entry.stat().st_size
                    count += 1
    return total, count


def list_copies() -> list[dict[str, Any]]:
    """One dict per location with local shard copies: `unstall cache list`."""
    out = []
    root = files_root()
    if not os.path.isdir(root):
        return out
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, LOCATION_FILE)) as f:
                url = f.read().strip()
        except OSError:
            url = "?"
        try:
            held, count = _complete(path)
        except OSError:
            continue
        out.append({"tier": "shards", "name": name, "location": url, "path": path,
                    "file_bytes": held, "shards": count})  # fmt: skip
    return out


def clear_copies(name: str | None = None) -> list[str]:
    """Remove the shard copies (all, or of the location ``name``: its directory name or URL)
    that no process is downloading; returns what was removed. Readers keep their open files."""
    removed = []
    for row in list_copies():
        if name is not None and name not in (row["name"], row["location"]):
            continue
        busy = False
        with os.scandir(row["path"]) as entries:
            for entry in entries:
                if entry.name.endswith(".lock"):
                    fd = _try_lock(entry.path)
                    busy = busy or fd is None
                    if fd is not None:
                        _unlock(fd)
        if busy:
            continue
        shutil.rmtree(row["path"], ignore_errors=True)
        removed.append(f"{row['location']} (shard copies)")
    return removed
