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
        encoded = [k.encode("utf-8") for k in keys]
        self._blob = b"".join(encoded)
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        self._offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
        np.cumsum(lengths, out=self._offsets[1:])

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
