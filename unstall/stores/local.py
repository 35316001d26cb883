"""A store over a local directory: keys are relative paths under the root."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np

from unstall.errors import MissingKeyError, StoreError
from unstall.stores.base import Store
from unstall.stores.listing import Listing, local_versions, stat_versions


class LocalStore(Store):
    """Files under a root directory, read with plain ``os`` calls.

    Args:
        root: the directory; keys are '/'-separated paths relative to it.
        bypass_page_cache: after reading a file, tell the kernel to drop its pages
            (``posix_fadvise(DONTNEED)``), so data held in unstall's own cache is not
            also held by the page cache, and benchmarks see storage, not memory.
    """

    schemes = ("", "file")

    def __init__(self, root: str | os.PathLike[str], *, bypass_page_cache: bool = False):
        root = os.fspath(root)
        if root.startswith("file://"):
            root = root[len("file://") :]
        self.root = Path(root).expanduser().resolve()
        if not self.root.is_dir():
            raise StoreError(
                f"local store root {str(self.root)!r} is not a directory; "
                "pass an existing dataset directory (see `unstall make-dataset`)",
                store=str(self.root),
            )
        self.bypass_page_cache = bypass_page_cache
        self._fds: dict[str, tuple[int, int]] = {}  # key -> (descriptor, pid): `read_range`

    @property
    def url(self) -> str:
        return str(self.root)

    def path(self, key: str) -> Path:
        """The file that holds ``key``."""
        return self.root / key

    def _get(self, key: str) -> bytes:
        path = os.path.join(self.root, key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise MissingKeyError(
                f"key {key!r} not found in local store {str(self.root)!r} (no file {path})",
                key=key,
                store=self.url,
            ) from None
        except OSError as exc:
            raise StoreError(
                f"cannot open key {key!r} in local store {self.url!r}: {exc}",
                key=key,
                store=self.url,
            ) from exc
        try:
            size = os.fstat(fd).st_size
            chunks = []
            remaining = size
            while remaining > 0:
                chunk = os.read(fd, remaining)
                if not chunk:
                    break
                chunks.append(chunk)
                remaining -= len(chunk)
            data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self.bypass_page_cache:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            return data
        finally:
            os.close(fd)

    def read_range(
        self, key: str, start: int, end: int, *, size: int | None = None, version: str | None = None
    ) -> bytes:
        """Bytes ``[start, end)`` of ``key``'s file, in place (``pread``), after checking it is
        still the ``size`` and ``version`` (``mtime_ns``) the caller read it at, if given.

        Checked on every read (an ``fstat``, about a microsecond): a file rewritten in place
        keeps its inode, so an open descriptor would read new bytes at old offsets.
        """
        pid = os.getpid()
        fds = self.__dict__.setdefault("_fds", {})
        got = fds.get(key)
        if got is None or got[1] != pid:
            try:
                got = (os.open(os.path.join(self.root, key), os.O_RDONLY), pid)
            except FileNotFoundError:
                raise MissingKeyError(
                    f"key {key!r} not found in local store {self.url!r}", key=key, store=self.url
                ) from None
            fds[key] = got
        if size is not None or version is not None:
            st = os.fstat(got[0])
            if (size is not None and st.st_size != size) or (
                version is not None and str(st.st_mtime_ns) != version
            ):
                raise StoreError(
                    f"shard {key!r} under {self.url!r} changed since it was indexed (size "
                    f"{size} -> {st.st_size}, mtime_ns {version} -> {st.st_mtime_ns}): make "
                    "the dataset again to re-index it",
                    key=key,
                    store=self.url,
                )
        data = os.pread(got[0], end - start, start)
        if len(data) != end - start:
            raise StoreError(
                f"shard {key!r} under {self.url!r} is shorter than its index says "
                f"({start}..{end} asked, {len(data)} bytes read): it changed; make the dataset "
                "again to re-index it",
                key=key,
                store=self.url,
            )
        return data

    def read_ranges(
        self, items: Sequence[tuple[str, Sequence[tuple[int, int]], str | None]]
    ) -> list[list[bytes]]:
        """For each ``(key, [(start, end), ...], mtime_ns or None)``, its ranges' bytes."""
        return [[self.read_range(k, a, b, version=v) for a, b in r] for k, r, v in items]

    def close(self) -> None:
        """Close this process's descriptors (`read_range`)."""
        pid = os.getpid()
        for fd, owner in self.__dict__.get("_fds", {}).values():
            if owner == pid:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._fds = {}

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_fds": {}}

    def _list(self, prefix: str) -> list[str]:
        return [key for key, _ in _scan(self.root, prefix, stat=False)]

    def list_entries(self, prefix: str = "") -> Listing:
        """Every file under ``prefix`` with size, mtime and version (one ``stat`` each)."""
        rows = sorted(_scan(self.root, prefix, stat=True))
        cols = np.array([st for _, st in rows], dtype=np.int64).reshape(-1, 3).T
        sizes, mtimes, inodes = cols[0].copy(), cols[1].copy(), cols[2]
        keys = [key for key, _ in rows]
        return Listing(keys, sizes, mtimes, local_versions(sizes, mtimes, inodes))

    def versions(self, keys: Sequence[str]) -> np.ndarray:
        """Each key's version from its file's size, mtime and inode (one ``stat`` each)."""
        return stat_versions(str(self.root), keys, len(keys))

    def _put(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def drop_page_cache(self, keys: list[str] | None = None) -> None:
        """Evict the files of ``keys`` (default: all) from the OS page cache, for cold runs."""
        keys = keys if keys is not None else self._list("")
        drop_page_cache([os.path.join(self.root, key) for key in keys])


def drop_page_cache(paths: Iterable[str]) -> None:
    """Drop the page cache of ``paths`` (``posix_fadvise(DONTNEED)``): their next reads go to
    storage (a cold run). Files that cannot be opened are skipped. The one place unstall
    drops pages by path (`LocalStore.drop_page_cache`, `unstall.cache.files`)."""
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _scan(root: Path, prefix: str, *, stat: bool) -> Iterator[tuple[str, tuple[int, int, int]]]:
    """``(key, (size, mtime_ns, inode))`` of every file under ``root/prefix`` (``os.scandir``,
    one directory open at a time; the stat tuple is zeros unless ``stat``)."""
    none = (0, 0, 0)
    stack = [prefix.strip("/")]
    while stack:
        rel = stack.pop()
        try:
            it = os.scandir(os.path.join(root, rel) if rel else root)
        except (FileNotFoundError, NotADirectoryError):
            continue
        with it:
            for entry in it:
                key = f"{rel}/{entry.name}" if rel else entry.name
                if entry.is_dir():
                    if not entry.is_symlink():  # as os.walk: a linked folder is not entered
                        stack.append(key)
                elif not stat:
                    yield key, none
                else:
                    try:
                        st = entry.stat()
                    except FileNotFoundError:  # removed since the directory was read
                        continue
                    yield key, (st.st_size, st.st_mtime_ns, st.st_ino)
