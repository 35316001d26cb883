"""Versioned listings: each object's key, size, modification time and version, in columns.

`Store.list_entries` returns a `Listing`; `Store.versions` gives the version of
given keys. A *version* is one int64 that changes whenever the object's bytes may
have: a local file's size, ``st_mtime_ns`` and inode; an S3 object's size and
ETag. Caches store it beside each item and serve an item only to a reader that
expects the same version (`unstall.cache.shm.index`). It is never 0 (0 means
"unversioned").

Columns rather than one object per entry, so a listing of millions of objects
costs a few arrays, not millions of Python objects; `Listing.entries` yields
`Entry` records for code that wants them one at a time.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@dataclass(frozen=True)
class Entry:
    """One object of a listing.

    Attributes:
        key: the store key.
        size: bytes [Unit: byte].
        version: the int64 version (see the module notes).
        mtime_ns: last modification [Unit: nanosecond since the epoch].
        etag: the server's ETag (S3), or "" (local files).
    """

    key: str
    size: int
    version: int
    mtime_ns: int
    etag: str = ""


@dataclass(frozen=True)
class Listing:
    """A store's keys (sorted) with sizes, modification times and versions, as columns."""

    keys: list[str]
    sizes: np.ndarray
    mtimes_ns: np.ndarray
    versions: np.ndarray
    etags: list[str] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def entries(self) -> Iterator[Entry]:
        """One `Entry` per object, in key order."""
        for j, key in enumerate(self.keys):
            etag = self.etags[j] if self.etags is not None else ""
            yield Entry(
                key, int(self.sizes[j]), int(self.versions[j]), int(self.mtimes_ns[j]), etag
            )

    def versions_of(self, keys: Sequence[str]) -> np.ndarray:
        """The version of each of ``keys`` (0 for a key not in the listing)."""
        return self._column_of(self.versions, keys)

    def sizes_of(self, keys: Sequence[str]) -> np.ndarray:
        """The size of each of ``keys`` in bytes (-1 for a key not in the listing)."""
        return self._column_of(self.sizes, keys, missing=-1)

    def _column_of(self, column: np.ndarray, keys: Sequence[str], missing: int = 0) -> np.ndarray:
        if len(keys) == len(self.keys) and all(
            a == b for a, b in zip(keys, self.keys, strict=True)
        ):
            return column.copy()
        where = {key: j for j, key in enumerate(self.keys)}
        return np.fromiter(
            (column[where[k]] if k in where else missing for k in keys),
            dtype=np.int64,
            count=len(keys),
        )


def mix(*columns: np.ndarray) -> np.ndarray:
    """One nonzero int64 per row from integer columns (splitmix64 of each, chained)."""
    n = len(columns[0])
    h = np.full(n, _GOLDEN, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for col in columns:
            z = h ^ np.asarray(col).astype(np.int64).view(np.uint64)
            z = z + _GOLDEN
            z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
            z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
            h = z ^ (z >> np.uint64(31))
    return (h | np.uint64(1)).view(np.int64)


_MASK = (1 << 64) - 1


def mix_ints(*values: int) -> int:
    """`mix` of one row, in plain integers: the same nonzero int64 as ``mix(*columns)[0]``
    for columns holding ``values``, at a few microseconds instead of a hundred (numpy's
    per-call cost on one-element arrays; a cache hit computes its file's version)."""
    golden = int(_GOLDEN)
    h = golden
    for v in values:
        z = ((h ^ (v & _MASK)) + golden) & _MASK
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        h = z ^ (z >> 31)
    h |= 1
    return h - (1 << 64) if h >> 63 else h


def local_versions(sizes: np.ndarray, mtimes_ns: np.ndarray, inodes: np.ndarray) -> np.ndarray:
    """Versions of local files: a file rewritten in place changes its mtime, one replaced
    by a rename changes its inode."""
    return mix(sizes, mtimes_ns, inodes)


def etag_versions(sizes: np.ndarray, etags: Sequence[str]) -> np.ndarray:
    """Versions of objects from their sizes and ETags."""
    words = np.fromiter(
        (
            int.from_bytes(hashlib.blake2b(e.encode(), digest_size=8).digest(), "little")
            for e in etags
        ),
        dtype=np.uint64,
        count=len(etags),
    )
    return mix(sizes, words.view(np.int64))


def stat_versions(root: str, keys: Iterable[str], n: int) -> np.ndarray:
    """Versions of the ``n`` files ``root/key``, one ``os.stat`` each; a missing file gets
    version 0 (its read fails with the store's own error)."""
    import os

    cols = np.zeros((3, n), dtype=np.int64)
    stat, base = os.stat, os.path.join(root, "")
    for j, key in enumerate(keys):
        try:
            st = stat(base + key)
        except OSError:
            continue
        cols[0, j], cols[1, j], cols[2, j] = st.st_size, st.st_mtime_ns, st.st_ino
    versions = local_versions(cols[0], cols[1], cols[2])
    versions[cols[2] == 0] = 0
    return versions
