"""Whole remote shards kept on local disk, fetched once per node, read with ``pread``.

The disk tier of a sharded dataset: one file per shard under
``$UNSTALL_CACHE_DIR/shards/files/<location>/``, named by the shard's key and
version, so a rewritten shard is a new file and the old one is removed. A file
appears only when complete (written as ``.part``, then renamed). Workers and jobs
of a node that need the same shard take its ``flock``: one downloads, the others
wait for the file, so each shard is fetched once.

In window mode (`evict`) any process may delete any copy beyond the budget, including
one another process has just made present but not opened yet. A reader therefore opens
what it needs (`open`: an open descriptor keeps a deleted copy readable) and downloads
again a copy deleted between `ensure` and its open, then reads only through its
descriptors; a process closes its descriptors of deleted copies it no longer reads, so
their disk space is freed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import time
from collections.abc import Iterable
from typing import Any

from unstall.data.shards.index import LOCATION_FILE, ShardInfo, index_root, name_dir
from unstall.machine import cache_dir
from unstall.stores import locks

#: Rounds of `ShardFiles.open` (download again, open) for copies evicted before they opened.
OPEN_TRIES = 5


def files_root() -> str:
    """Where every location's shard copies are: ``$UNSTALL_CACHE_DIR/shards/files``."""
    return os.path.join(cache_dir(), "shards", "files")


class ShardFiles:
    """The local copies of one location's shards."""

    def __init__(self, location_url: str, directory: str | None = None):
        digest = hashlib.blake2b(location_url.encode(), digest_size=12).hexdigest()
        self.dir = directory or os.path.join(files_root(), digest)
        name_dir(self.dir, location_url)  # what these copies are of, for `unstall cache list`
        self._fds: dict[str, tuple[int, int]] = {}  # path -> (descriptor, pid that opened it)
        self.downloaded = 0  # shards this process asked the store for
        #: (thread, pid, keys) of this process's background download (`start_background`)
        self._background: tuple[Any, int, set[str]] | None = None

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
        """Make every shard of ``infos`` present locally, each downloaded at most once per node
        (the store's lock beside each file: one process downloads, the others wait for it).

        While this process's background download runs (`start_background`), a shard it
        will bring is waited for rather than asked of the store a second time.
        Returns ``then(path, key)`` of each shard, by key, when ``then`` is given.
        """
        wanted = list(dict.fromkeys(infos))
        missing = [i for i in wanted if not self.have(i)]
        self._wait_background(missing)
        todo = wanted if then is not None else [i for i in missing if not self.have(i)]
        if not todo:
            return {}
        results = location.download([(info, self.path(info)) for info in todo], then)
        self.downloaded += len(todo)
        return {info.key: r for info, r in zip(todo, results, strict=True)}

    def start_background(self, location: Any, infos: list[ShardInfo], then: Any = None) -> None:
        """Download the missing shards of ``infos`` in that order (the epoch's), in a thread,
        and return at once; the first land first (`unstall.stores.s3_ranges.DOWNLOADS` at a
        time); ``then(path, key)`` runs on each as it lands (indexing it). Failures are left
        to the batches' own fetches, which retry them."""
        import threading

        missing = [i for i in dict.fromkeys(infos) if not self.have(i)]
        running = self._background
        if not missing or (running is not None and running[0].is_alive()):
            return
        pid = os.getpid()

        def run() -> None:
            with contextlib.suppress(Exception):
                location.download([(info, self.path(info)) for info in missing], then)

        thread = threading.Thread(target=run, daemon=True, name="unstall-shard-downloads")
        self._background = (thread, pid, {i.key for i in missing})
        thread.start()

    def background_running(self) -> bool:
        running = self._background
        return running is not None and running[1] == os.getpid() and running[0].is_alive()

    def _wait_background(self, missing: list[ShardInfo]) -> None:
        """Wait for the shards of ``missing`` that this process's background download brings."""
        running = self._background
        if running is None or running[1] != os.getpid():
            return
        thread, _pid, keys = running
        for info in missing:
            if info.key not in keys:
                continue
            while thread.is_alive() and not self.have(info):
                time.sleep(0.005)

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

    def open(self, location: Any, infos: list[ShardInfo]) -> None:
        """Make every shard of ``infos`` present (`ensure`) and open in this process, so that
        `pread` reads it even if another process evicts it now.

        A copy deleted after `ensure` saw it and before it was opened (another worker's or
        job's `evict`) is downloaded again; after `OPEN_TRIES` such rounds the last
        `FileNotFoundError` is raised (a disk budget too small for the shards in use).
        """
        pid = os.getpid()
        held = {path for path, (_, owner) in self._fds.items() if owner == pid}
        todo = [i for i in dict.fromkeys(infos) if self.path(i) not in held]  # open already
        for attempt in range(OPEN_TRIES):
            self.ensure(location, todo)
            gone = []
            for info in todo:
                try:
                    self._fd(info)
                except FileNotFoundError:
                    if attempt == OPEN_TRIES - 1:
                        raise
                    gone.append(info)
            if not gone:
                return
            todo = gone

    def _fd(self, info: ShardInfo) -> int:
        """This process's descriptor of ``info``'s copy (opened now if it has none)."""
        path = self.path(info)
        pid = os.getpid()
        got = self._fds.get(path)
        if got is None or got[1] != pid:
            got = (os.open(path, os.O_RDONLY), pid)
            self._fds[path] = got
        return got[0]

    def release(self, keep: list[ShardInfo]) -> int:
        """Close this process's descriptors of copies no longer on disk (evicted), but
        ``keep``'s: the space they held is freed. Returns how many were closed."""
        pid = os.getpid()
        kept = {self.path(i) for i in keep}
        closed = 0
        for path, (fd, owner) in list(self._fds.items()):
            if owner != pid:
                del self._fds[path]  # inherited from the parent: not this process's to close
            elif path not in kept and not os.path.exists(path):
                del self._fds[path]
                os.close(fd)
                closed += 1
        return closed

    def pread(self, info: ShardInfo, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of the local copy of ``info``'s shard (opened by `open`, or
        now if it is not)."""
        return os.pread(self._fd(info), end - start, start)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_fds"] = {}
        state["_background"] = None
        return state


def _complete(directory: str) -> tuple[int, int]:
    """(bytes, count) of the complete files in ``directory`` (no ``.part``/``.lock``/``.txt``)."""
    total = count = 0
    with os.scandir(directory) as it:
        for entry in it:
            if "." not in entry.name or entry.name.endswith(".npz"):
                with contextlib.suppress(OSError):
                    total += entry.stat().st_size
                    count += 1
    return total, count


def _named_dirs(root: str) -> dict[str, list[str]]:
    """location URL -> its directories under ``root`` (each names its location)."""
    out: dict[str, list[str]] = {}
    if not os.path.isdir(root):
        return out
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        try:
            with open(os.path.join(path, LOCATION_FILE)) as f:
                url = f.read().strip()
        except OSError:
            url = "?"
        out.setdefault(url, []).append(path)
    return out


def list_copies() -> list[dict[str, Any]]:
    """One dict per location with local shard copies or index files: `unstall cache list`."""
    copies, indexes = _named_dirs(files_root()), _named_dirs(index_root())
    out = []
    for url in sorted(set(copies) | set(indexes)):
        held = count = index_bytes = index_count = 0
        for path in copies.get(url, []):
            with contextlib.suppress(OSError):
                b, n = _complete(path)
                held, count = held + b, count + n
        for path in indexes.get(url, []):
            with contextlib.suppress(OSError):
                b, n = _complete(path)
                index_bytes, index_count = index_bytes + b, index_count + n
        paths = copies.get(url, []) + indexes.get(url, [])
        out.append({"tier": "shards", "name": os.path.basename(paths[0]), "location": url,
                    "path": paths[0], "paths": paths, "file_bytes": held, "shards": count,
                    "index_bytes": index_bytes, "indexes": index_count})  # fmt: skip
    return out


def clear_copies(name: str | None = None) -> list[str]:
    """Remove the shard copies and index files (all, or of the location ``name``: a directory
    name or the URL) that no process is downloading; returns what was removed. Readers keep
    their open files."""
    removed = []
    for row in list_copies():
        names = {row["location"], *(os.path.basename(p) for p in row["paths"])}
        if name is not None and name not in names:
            continue
        if any(_busy(path) for path in row["paths"]):
            continue
        for path in row["paths"]:
            shutil.rmtree(path, ignore_errors=True)
        what = "shard copies" if row["shards"] or not row["indexes"] else "shard index"
        removed.append(f"{row['location']} ({what})")
    return removed


def _busy(directory: str) -> bool:
    """Whether a process holds a download lock in ``directory``."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.name.endswith(".lock"):
                fd = locks.try_lock(entry.path)
                if fd is None:
                    return True
                locks.unlock(fd)
    return False
