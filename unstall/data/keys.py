"""A compact, fork-friendly table of string keys.

Millions of Python ``str`` objects in a dataset are touched by refcounting in
every forked worker, which copies the pages (the well-known "DataLoader memory
leak"). One bytes blob plus an offsets array is never written after creation.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np


class KeyTable(Sequence[str]):
    """An immutable sequence of keys stored as one UTF-8 blob and int64 offsets."""

    def __init__(self, keys: Iterable[str]):
        keys = keys if isinstance(keys, list | tuple) else list(keys)
        blob = "".join(keys).encode("utf-8")
        lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
        if len(blob) != int(lengths.sum()):  # not all ASCII: lengths in bytes, key by key
            encoded = [k.encode("utf-8") for k in keys]
            lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(keys))
        self._blob = blob
        self._offsets = np.zeros(len(keys) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self._offsets[1:])

    @classmethod
    def from_arrays(cls, blob: bytes, offsets: np.ndarray) -> KeyTable:
        """A table from `arrays` (e.g. loaded from a file): no Python string is made."""
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or not len(offsets) or offsets[0] != 0 or offsets[-1] != len(blob):
            raise ValueError(f"offsets do not describe a blob of {len(blob)} bytes")
        table = cls.__new__(cls)
        table._blob, table._offsets = blob, offsets
        return table

    def arrays(self) -> tuple[bytes, np.ndarray]:
        """``(blob, offsets)``: the UTF-8 keys back to back and where each starts (n + 1)."""
        return self._blob, self._offsets

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, index):  # type: ignore[override]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"key index {index} out of range for {n} keys")
        start, end = self._offsets[index], self._offsets[index + 1]
        return self._blob[start:end].decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        offsets = self._offsets.tolist()
        blob = self._blob
        for i in range(len(offsets) - 1):
            yield blob[offsets[i] : offsets[i + 1]].decode("utf-8")

    def fingerprint(self) -> str:
        """A short hash of every key in order: two tables with equal keys match."""
        digest = hashlib.blake2b(self._blob, digest_size=16)
        digest.update(self._offsets.tobytes())
        return digest.hexdigest()
