"""`S3Store`: objects in S3 or any S3-compatible server, many requests in flight per process.

Built on obstore (Rust ``object_store`` with native async): one asyncio loop per
process drives up to ``max_inflight`` GETs for a whole batch. Each process makes
its own client: a torch worker builds one on first use (pid check), the process
that made the store sends its requests to a forked helper (obstore does not
survive fork once used), and pickled copies drop the client.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from unstall import machine
from unstall.errors import EmptyDatasetError
from unstall.stores import manifest
from unstall.stores.base import Store, _check_key
from unstall.stores.listing import Listing, etag_versions
from unstall.stores.s3_config import S3Settings, resolve
from unstall.stores.s3_stats import SharedStats


class S3Store(Store):
    """Objects under ``s3://bucket/prefix``; keys are paths relative to the prefix.

    Credentials, region and endpoint come from the arguments, else the usual AWS
    environment variables (``AWS_ACCESS_KEY_ID``, ``AWS_REGION``,
    ``AWS_ENDPOINT_URL`` ...), else ``~/.aws/config`` and ``~/.aws/credentials``.

    Args:
        url: ``s3://bucket/prefix``.
        endpoint: endpoint URL of an S3-compatible server (``http://host:port``).
        region: region; default from the environment, else ``us-east-1``.
        max_inflight: requests in flight per process. Default (None): measured
            latency x ``target_rate`` (Little's law) from 3 probe GETs on first use,
            clamped to [16, 256]; env ``UNSTALL_S3_MAX_INFLIGHT`` overrides.
        target_rate: requests/s per process the default ``max_inflight`` aims for.
        retries: retries per key for timeouts, resets, 5xx and throttling
            (env ``UNSTALL_S3_RETRIES``, default 6); 403/404 are never retried.
        timeout: seconds per request attempt (env ``UNSTALL_S3_TIMEOUT``, default 30).
        manifest_dir: where `list_cached` keeps listings (default
            ``$UNSTALL_CACHE_DIR/manifests`` or ``~/.cache/unstall/manifests``).
        config: extra obstore ``S3Config`` keys, e.g. ``{"access_key_id": ...}``.
        in_process: make requests in this process instead of a forked helper; only
            for processes that will not fork workers afterwards (CLI uploads).
    """

    schemes = ("s3",)
    prefetches = True

    def __init__(
        self,
        url: str,
        *,
        endpoint: str | None = None,
        region: str | None = None,
        max_inflight: int | None = None,
        target_rate: float = 2000.0,
        retries: int | None = None,
        timeout: float | None = None,
        manifest_dir: str | os.PathLike[str] | None = None,
        config: dict[str, str] | None = None,
        in_process: bool = False,
    ):
        env_inflight = machine.s3_max_inflight()
        env_retries = machine.s3_retries()
        env_timeout = machine.s3_timeout()
        self.settings: S3Settings = resolve(
            url,
            endpoint=endpoint,
            region=region,
            config=config,
            max_inflight=max_inflight if max_inflight is not None else env_inflight,
            target_rate=target_rate,
            retries=retries if retries is not None else env_retries,
            timeout=timeout if timeout is not None else env_timeout,
        )
        self.manifest_dir = manifest.manifest_dir(manifest_dir)
        self.in_process = in_process
        self._owner_pid: int | None = os.getpid()
        self._stats = SharedStats()
        self._backend: Any = None
        self._backend_pid: int | None = None
        self._listing: Listing | None = None  # made by this process (see `versions`)

    @property
    def url(self) -> str:
        return self.settings.url

    @property
    def bucket(self) -> str:
        return self.settings.bucket

    # Per-process client -----------------------------------------------------------
    def _client(self) -> Any:
        pid = os.getpid()
        if self._backend is not None and self._backend_pid == pid:
            return self._backend
        # new process (fork) or first use: never touch an inherited client
        if pid == self._owner_pid and not self.in_process:
            from unstall.stores.s3_helper import Helper

            backend: Any = _HelperBackend(Helper(self.settings, self._stats), self.settings)
        else:
            from unstall.stores.s3_client import Fetcher

            backend = Fetcher(self.settings, self._stats)
        self._backend, self._backend_pid = backend, pid
        return backend

    def client_info(self) -> dict[str, Any]:
        """Which process built this process's client, and how (for tests and debugging)."""
        backend = self._backend if self._backend_pid == os.getpid() else None
        return {
            "pid": os.getpid(),
            "client_pid": getattr(backend, "pid", None),
            "kind": type(backend).__name__ if backend is not None else None,
            "max_inflight": getattr(backend, "max_inflight", None),
        }

    def set_inflight(self, n: int) -> None:
        """Requests in flight per process from now on, in this process and every process that
        shares the store (forked workers read it before each batch): the knob
        ``num_workers="auto"`` turns for fetch-bound data (`unstall.loader.autotune`)."""
        if not 1 <= n <= 4096:
            raise ValueError(f"requests in flight {n} must be in [1, 4096]")
        self._stats.set(inflight_limit=n)

    def queued(self) -> int:
        """Requests so far, over every process sharing the store, that waited for a slot
        because the requests in flight were at the limit (the limit binds)."""
        return int(self._stats.get("queued"))

    def inflight(self) -> int | None:
        """Requests in flight per process now: the limit `set_inflight` set, else the measured
        choice (`max_inflight` of the first process that probed), else the setting."""
        snap = self._stats.snapshot()
        return snap["inflight_limit"] or snap["max_inflight"] or self.settings.max_inflight

    # Store hooks ------------------------------------------------------------------
    def _get(self, key: str) -> bytes:
        return self._client().get_many([key])[0]

    def _get_many(self, keys: list[str]) -> list[bytes]:
        if not keys:
            return []
        return self._client().get_many(keys)

    def prefetch(self, keys: Sequence[str]) -> None:
        """Start GETs for ``keys`` in the background (in worker processes; elsewhere a no-op)."""
        if not keys or (os.getpid() == self._owner_pid and not self.in_process):
            return  # this process's requests go through a helper: no look-ahead there
        self._client().prefetch(list(keys))

    def read_ranges(
        self, items: Sequence[tuple[str, Sequence[tuple[int, int]], str | None]]
    ) -> list[list[bytes]]:
        """For each ``(key, [(start, end), ...], ETag or None)``, the bytes of its ranges, all
        in flight; an answer with another ETag raises `ObjectChangedError` (never stale bytes)."""
        work = [(key, [(int(a), int(b)) for a, b in ranges], etag) for key, ranges, etag in items]
        return self._client().read_ranges(work) if work else []

    def download(
        self,
        items: Sequence[tuple[str, str, int, str | None]],
        then: Callable[[str, str], Any] | None = None,
        *,
        parallel: int | None = None,
    ) -> list[Any]:
        """Whole objects ``(key, dest path, size, ETag or None)`` into local files, streamed,
        ``parallel`` at a time in the given order, each once per node (a lock beside ``dest``);
        ``then(dest, key)`` runs on each as it is present (`RangeOps.download_many`)."""
        from unstall.stores.s3_ranges import DOWNLOADS

        if not items:
            return []
        return self._client().download_many(list(items), then, parallel or DOWNLOADS)

    def _list(self, prefix: str) -> list[str]:
        keys = self._client().list(prefix.strip("/"))
        if not keys:
            where = f"{self.url.rstrip('/')}/{prefix}" if prefix else self.url
            raise EmptyDatasetError(
                f"no objects under {where} (endpoint {self.settings.endpoint or 'AWS'}): check "
                "the bucket, prefix and endpoint, or upload a dataset with "
                f"`unstall make-dataset {where}`"
            )
        return keys

    def _put(self, key: str, data: bytes) -> None:
        self._client().put(key, data)

    def put_many(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Upload many objects with many requests in flight (used by `unstall make-dataset`)."""
        for key, _ in items:
            _check_key(key, self.url)
        if items:
            self._client().put_many(list(items))

    def list_entries(self, prefix: str = "") -> Listing:
        """Every object under ``prefix`` with its size, ETag and version, listed now."""
        rows = sorted(self._client().list_entries(prefix.strip("/")))
        if not rows:
            self._list(prefix)  # raises the empty-listing error
        listing = _listing_of(rows)
        if not prefix:
            self._listing = listing
            path = manifest.manifest_path(self.url, self.settings.endpoint, self.manifest_dir)
            manifest.write_manifest(path, self.url, listing.keys, rows)
        return listing

    def listed(self) -> Listing | None:
        """The whole listing this process made (`list_entries`, `versions`), if any."""
        return self._listing

    def versions(self, keys: Sequence[str]) -> np.ndarray:
        """Each key's version (size + ETag) from a listing made by this process (listed now
        if none was: one LIST request per 1,000 objects, no request per object).

        A manifest from an earlier run is not trusted for versions: objects may have been
        overwritten since. The fresh listing also refreshes the manifest.
        """
        listing = self._listing if self._listing is not None else self.list_entries()
        return listing.versions_of(keys)

    def list_cached(self, *, refresh: bool = False) -> list[str]:
        """Every key, sorted, from the manifest file if there is one, else listed once and saved.

        Pass ``refresh=True`` (or delete the file) after the bucket changed. Versions are
        not taken from the manifest (see `versions`).
        """
        path = manifest.manifest_path(self.url, self.settings.endpoint, self.manifest_dir)
        if not refresh:
            keys = manifest.read_manifest(path, self.url)
            if keys is not None:
                return keys
        return self.list_entries().keys

    def stats(self) -> dict[str, Any]:
        """Request counters summed over this process, its helper and its forked workers."""
        out: dict[str, Any] = {"url": self.url}
        out.update(self._stats.snapshot())
        if out["inflight_limit"] is None:  # only once a tuner set one
            del out["inflight_limit"]
        if out["max_inflight"] is None and self.settings.max_inflight is not None:
            out["max_inflight"] = self.settings.max_inflight
        return {"store": out}

    def close(self) -> None:
        if self._backend is not None and self._backend_pid == os.getpid():
            self._backend.close()
        self._backend = self._backend_pid = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_backend"] = state["_backend_pid"] = None
        state["_owner_pid"] = None  # an unpickled copy builds its own in-process client
        state["_listing"] = None  # workers get the versions from the dataset, not the store
        return state


class _HelperBackend:
    """`Fetcher`'s interface, forwarded to the helper process."""

    def __init__(self, helper: Any, settings: S3Settings):
        self.helper = helper
        self.pid = helper.pid
        self.max_inflight = settings.max_inflight
        # seconds one key may take, all retries included; the helper's own bound is tighter
        self._bound = (settings.retries + 1) * (settings.timeout + 1.0 + settings.max_backoff_s)

    def _rounds(self, n: int) -> int:
        """An upper bound on rounds of requests for ``n`` keys, probes included."""
        from unstall.stores.s3_client import MIN_INFLIGHT, PROBES

        return PROBES + math.ceil(n / (self.max_inflight or MIN_INFLIGHT))

    def get_many(self, keys: list[str]) -> list[bytes]:
        bound_s = self._bound * self._rounds(len(keys)) + 30
        return self.helper.call("get_many", keys, bound_s=bound_s)

    def read_ranges(self, items: list[Any]) -> list[list[bytes]]:
        n = sum(len(ranges) for _key, ranges, _etag in items)
        return self.helper.call("read_ranges", items, bound_s=self._bound * self._rounds(n) + 30)

    def download_many(self, items: list[Any], then: Any, parallel: int) -> list[Any]:
        # no bound on the whole call: the helper bounds each stream's progress piece by piece
        return self.helper.call("download_many", items, then, parallel, bound_s=None)

    def list(self, prefix: str) -> list[str]:
        return self.helper.call("list", prefix, bound_s=self._bound * 100)

    def list_entries(self, prefix: str) -> list[tuple[str, int, str, int]]:
        return self.helper.call("list_entries", prefix, bound_s=self._bound * 100)

    def put(self, key: str, data: bytes) -> None:
        self.helper.call("put", key, data, bound_s=self._bound + 10)

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        self.helper.call("put_many", items, bound_s=self._bound * self._rounds(len(items)) + 30)

    def close(self) -> None:
        self.helper.close()


def _listing_of(rows: list[tuple[str, int, str, int]]) -> Listing:
    sizes = np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows))
    mtimes = np.fromiter((r[3] for r in rows), dtype=np.int64, count=len(rows))
    etags = [r[2] for r in rows]
    return Listing([r[0] for r in rows], sizes, mtimes, etag_versions(sizes, etags), etags)
