"""Where a dataset's shards live: a local directory (read in place) or an ``s3://`` prefix.

`Location` lists shards with their size and version (local: ``mtime_ns``; S3:
ETag, from the same LIST request), reads byte ranges, and downloads whole
shards. Remote requests are made by a `ShardClient` built in each process; the
process that made the location (which forks loader workers later) sends its
requests to a short-lived forked child instead, as `unstall.stores.s3` does.
"""

from __future__ import annotations

import os
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
        self._client: Any = None
        self._client_pid = -1
        self._owner = os.getpid()
        self._fds: dict[str, tuple[int, int]] = {}  # local: key -> (fd, pid)
        if self.remote:
            from unstall.stores.s3_config import resolve
            from unstall.stores.s3_stats import SharedStats

            opts = dict(store_options)
            self.settings = resolve(
                root,
                endpoint=opts.pop("endpoint", None),
                region=opts.pop("region", None),
                config=opts.pop("config", None),
                retries=opts.pop("retries", 6),
                timeout=opts.pop("timeout", 30.0),
                **opts,
            )
            self.stats_block = SharedStats()
            self.url = self.settings.url
        else:
            if store_options:
                raise ValueError(f"options {sorted(store_options)} apply to s3:// shards only")
            path = root[len("file://") :] if root.startswith("file://") else root
            self.root = os.path.abspath(os.path.expanduser(path or "."))
            if not os.path.isdir(self.root):
                raise StoreError(f"shard directory {self.root!r} does not exist", store=root)
            self.url = self.root

    # Listing ------------------------------------------------------------------------
    def listing(self, keys: list[str] | None, suffixes: tuple[str, ...]) -> list[ShardInfo]:
        """Each shard's (key, size, version): ``keys`` in order, or all files ending in a suffix."""
        if self.remote:
            found = {k: (size, etag) for k, size, etag in self._call("list", "")}
        else:
            found = {}
            if keys is None:
                for dirpath, _dirs, files in os.walk(self.root):
                    rel = os.path.relpath(dirpath, self.root)
                    for name in files:
                        key = name if rel == "." else f"{rel}/{name}".replace(os.sep, "/")
                        if key.endswith(suffixes):
                            found[key] = self._stat(key)
            else:
                for key in keys:
                    found[key] = self._stat(key)
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
        """Bytes ``[start, end)`` of a local shard; its version is checked when first opened."""
        fd = self._open_local(info)
        data = os.pread(fd, end - start, start)
        if len(data) != end - start:
            raise StoreError(
                f"shard {info.key!r} under {self.root!r} is shorter than its index says "
                f"({start}..{end} asked, {len(data)} bytes read): it changed; make the dataset "
                "again to re-index it",
                key=info.key,
                store=self.root,
            )
        return data

    def _open_local(self, info: ShardInfo) -> int:
        """This process's descriptor of a local shard, after checking it is the indexed version.

        Checked on every read (an ``fstat``, about a microsecond): a file rewritten in
        place keeps its inode, so an open descriptor would read new bytes at old offsets.
        """
        got = self._fds.get(info.key)
        pid = os.getpid()
        if got is None or got[1] != pid:
            got = (os.open(self.path(info.key), os.O_RDONLY), pid)
            self._fds[info.key] = got
        st = os.fstat(got[0])
        if (st.st_size, str(st.st_mtime_ns)) != (info.size, info.version):
            raise StoreError(
                f"shard {info.key!r} under {self.root!r} changed since it was indexed (size "
                f"{info.size} -> {st.st_size}, mtime_ns {info.version} -> {st.st_mtime_ns}): "
                "make the dataset again to re-index it",
                key=info.key,
                store=self.root,
            )
        return got[0]

    def read_ranges(
        self, items: list[tuple[ShardInfo, list[tuple[int, int]]]]
    ) -> list[list[bytes]]:
        """Byte ranges of remote shards, all in flight; each answer's ETag is checked."""
        if not items:
            return []
        work = [(info.key, ranges, info.version or None) for info, ranges in items]
        return self._call("read_ranges", work)

    def download(self, items: list[tuple[ShardInfo, str]], then: Any = None) -> list[Any]:
        """Whole remote shards into local files ``(info, dest path)``, all in flight;
        ``then(dest, key)`` runs on each as it completes (see `ShardClient.download_many`)."""
        if not items:
            return []
        work = [(i.key, dest, i.size, i.version or None) for i, dest in items]
        return self._call("download_many", work, then)

    def forked(self, fn: Any, *args: Any) -> Any:
        """``fn(*args)``: in a forked child when this process must not make requests (it made
        the location and forks loader workers later), so a whole survey (LIST, downloads,
        indexing) costs one child and one client; here otherwise."""
        if not self.remote or os.getpid() != self._owner:
            return fn(*args)
        from unstall.data.shards.s3_client import fork_call

        return fork_call(f"reading the shards under {self.url}", fn, *args)

    def _call(self, op: str, *args: Any) -> Any:
        from unstall.data.shards.s3_client import ShardClient, child_call

        if os.getpid() == self._owner:
            return child_call(self.settings, self.stats_block, op, *args)
        if self._client is None or self._client_pid != os.getpid():
            self._client, self._client_pid = (
                ShardClient(self.settings, self.stats_block),
                os.getpid(),
            )
        return getattr(self._client, op)(*args)

    def stats(self) -> dict[str, Any]:
        """Requests and bytes of every process (remote locations; forked workers included)."""
        if not self.remote:
            return {}
        snap = self.stats_block.snapshot()
        return {k: snap[k] for k in ("requests", "bytes", "retries", "errors", "list_requests")}

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_client=None, _client_pid=-1, _fds={}, _owner=-1)
        return state
