"""A store over a local directory: keys are relative paths under the root."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
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
        for key in keys if keys is not None else self._list(""):
            try:
                fd = os.open(os.path.join(self.root, key), os.O_RDONLY)
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
