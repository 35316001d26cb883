"""Where a dataset's shards live: a local directory (read in place) or an ``s3://`` prefix.

`Location` is the shard readers' one way to storage: a store of `unstall.stores`
(`LocalStore` or `S3Store`) does every request. It lists shards with their size
and version (local: ``mtime_ns``; S3: ETag, from the same LIST request), reads
byte ranges (checked against that version) and downloads whole shards. The
store keeps S3 clients out of forked workers (the process that made it sends
its requests to the store's helper process; each worker builds its own client),
and retries with the store's one rule.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from unstall.data.shards.index import ShardInfo
from unstall.errors import EmptyDatasetError, MissingKeyError, StoreError


class Location:
    """Shards under ``root`` (a directory or ``s3://bucket/prefix``).

    Args:
        root: the directory or URL.
        store_options: for ``s3://``: ``endpoint``, ``region``, ``config``, ``retries``,
            ``timeout``, ``max_inflight`` (as for `unstall.stores.s3.S3Store`).
    """

    def __init__(self, root: str, **store_options: Any):
        self.remote = root.startswith("s3://")
        #: every object of the last listing: key -> (size, version) (index objects included)
        self.listed: dict[str, tuple[int, str]] = {}
        if self.remote:
            from unstall.stores.s3 import S3Store

            self.store: Any = S3Store(root, **store_options)
            self.url = self.store.url
        else:
            if store_options:
                raise ValueError(f"options {sorted(store_options)} apply to s3:// shards only")
            from unstall.stores.local import LocalStore

            path = root[len("file://") :] if root.startswith("file://") else root
            self.root = os.path.abspath(os.path.expanduser(path or "."))
            if not os.path.isdir(self.root):
                raise StoreError(f"shard directory {self.root!r} does not exist", store=root)
            self.store = LocalStore(self.root)
            self.url = self.root

    # Listing ------------------------------------------------------------------------
    def listing(self, keys: list[str] | None, suffixes: tuple[str, ...]) -> list[ShardInfo]:
        """Each shard's (key, size, version): ``keys`` in order, or all files ending in a suffix."""
        if self.remote or keys is None:
            found = self._list_all()
        else:  # named local files: a stat each, not a walk of the directory
            found = {key: self._stat(key) for key in keys}
        self.listed = found
        if keys is None:
            keys = sorted(k for k in found if k.endswith(suffixes))
            if not keys:
                raise EmptyDatasetError(
                    f"no shards ending in {' or '.join(suffixes)} under {self.url!r}"
                )
        out = []
        for key in keys:
            if key not in found:
                raise MissingKeyError(
                    f"shard {key!r} not found under {self.url!r}", key=key, store=self.url
                )
            size, version = found[key]
            out.append(ShardInfo(key, size, version))
        return out

    def _list_all(self) -> dict[str, tuple[int, str]]:
        try:
            listing = self.store.list_entries()
        except EmptyDatasetError:
            return {}
        sizes = listing.sizes.tolist()
        if self.remote:
            versions = [str(e or "") for e in (listing.etags or [""] * len(listing.keys))]
        else:
            versions = [str(m) for m in listing.mtimes_ns.tolist()]
        return {k: (s, v) for k, s, v in zip(listing.keys, sizes, versions, strict=True)}

    def _stat(self, key: str) -> tuple[int, str]:
        try:
            st = os.stat(os.path.join(self.root, key))
        except FileNotFoundError:
            raise MissingKeyError(
                f"shard {key!r} not found under {self.root!r}", key=key, store=self.root
            ) from None
        return st.st_size, str(st.st_mtime_ns)

    # Reads ----------------------------------------------------------------------------
    def path(self, key: str) -> str:
        """The local file of ``key`` (local locations only)."""
        return os.path.join(self.root, key)

    def pread_local(self, info: ShardInfo, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of a local shard, in place, checked against its version."""
        return self.store.read_range(info.key, start, end, size=info.size, version=info.version)

    def read_ranges(
        self, items: list[tuple[ShardInfo, list[tuple[int, int]]]]
    ) -> list[list[bytes]]:
        """Byte ranges of shards, all in flight; each answer is checked against the version
        the index was built from (a rewritten shard raises, never gives stale bytes)."""
        if not items:
            return []
        return self.store.read_ranges([(i.key, ranges, i.version or None) for i, ranges in items])

    def get_many(self, keys: list[str]) -> list[bytes]:
        """Whole small objects (index objects beside the shards, ``index.json``)."""
        return self.store.get_many(keys) if keys else []

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        """Write objects beside the shards (their index objects)."""
        if not self.remote:
            for key, data in items:
                self.store.put(key, data)
        elif items:
            self.store.put_many(items)

    def download(
        self,
        items: list[tuple[ShardInfo, str]],
        then: Callable[[str, str], Any] | None = None,
        *,
        parallel: int | None = None,
    ) -> list[Any]:
        """Whole remote shards into local files ``(info, dest path)`` in order, each once per
        node; ``then(dest, key)`` runs on each as it is present (`S3Store.download`)."""
        if not items:
            return []
        work = [(i.key, dest, i.size, i.version or None) for i, dest in items]
        return self.store.download(work, then, parallel=parallel)

    def stats(self) -> dict[str, Any]:
        """Requests and bytes of every process (remote locations; forked workers included)."""
        if not self.remote:
            return {}
        snap = self.store.stats()["store"]
        return {k: snap[k] for k in ("requests", "bytes", "retries", "errors", "list_requests")}

    def close(self) -> None:
        self.store.close()
