"""Byte ranges and whole-object downloads: operations of the S3 client (`Fetcher`).

Large objects (dataset shards) are read by byte range: a batch's samples from a
shard as a few coalesced ranges (`RangeOps.read_ranges`), or a whole shard
streamed into a local file with ``pwrite`` as its bytes arrive
(`RangeOps.download_many`). Every answer's ETag is checked against the version
the caller read the object at, so a rewritten object is never read at stale
offsets (`ObjectChangedError`). Requests go through the client's one retry rule
(`Fetcher._retrying`: exponential backoff with full jitter); a stream cut part
way resumes from the first byte it lacks.

Downloads are node-wide once: each destination has a lock file beside it
(`unstall.stores.locks`); the process holding it writes ``dest.part.<pid>`` and
renames it to ``dest`` when whole, the others wait and find the file.
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Callable
from typing import Any

from unstall.errors import StoreError
from unstall.stores import locks

#: Bytes per ranged GET when a whole object is downloaded, streamed (measured through
#: the latency proxy, 3 shards of 64 MiB: one streamed GET each 0.20-0.23 s, 8 MiB ranges
#: 0.37-0.54 s: every extra request and its buffered copy costs CPU in client and server).
CHUNK = 64 << 20
#: Bytes a stream hands over at a time (written with one ``pwrite``).
STREAM_PIECE = 1 << 20
#: Objects downloaded at once per process, in the order given: the first ones land first
#: (all at once, they would all land at the end, sharing the bandwidth).
DOWNLOADS = 4

#: ``(key, dest path, size, ETag or None)``: one object to download.
DownloadItem = tuple[str, str, int, "str | None"]


def chunks(size: int) -> list[tuple[int, int]]:
    """``size`` bytes as equal ranges of about ``CHUNK`` (an object a little over k chunks,
    such as a 64 MiB shard plus its tar padding, takes k GETs, not k + 1)."""
    parts = max(1, math.ceil(size / CHUNK - 0.25))
    step = -(-size // parts)
    return [(a, min(a + step, size)) for a in range(0, size, step)] if size else []


class ObjectChangedError(StoreError):
    """An object's ETag differs from the version the caller read it at (it was rewritten)."""


class RangeOps:
    """Range reads and downloads; mixed into `unstall.stores.s3_client.Fetcher`, whose
    client, loop, semaphore, retry rule and counters they use."""

    settings: Any
    client: Any
    stats: Any

    def read_ranges(
        self, items: list[tuple[str, list[tuple[int, int]], str | None]]
    ) -> list[list[bytes]]:
        """For each ``(key, [(start, end), ...], ETag)``, the bytes of its ranges; all in flight."""

        async def one(key: str, ranges: list[tuple[int, int]], etag: str | None) -> list[bytes]:
            return list(await asyncio.gather(*(self._range(key, a, b, etag) for a, b in ranges)))

        async def all_ranges() -> list[list[bytes]]:
            self._semaphore()  # type: ignore[attr-defined]
            return list(await asyncio.gather(*(one(*item) for item in items)))

        n = sum(len(r) for _k, r, _e in items)
        rounds = math.ceil(n / (self.max_inflight or 16)) + 1  # type: ignore[attr-defined]
        try:
            return self._run(all_ranges(), rounds)  # type: ignore[attr-defined]
        finally:
            self._flush()  # type: ignore[attr-defined]

    def download_many(
        self,
        items: list[DownloadItem],
        then: Callable[[str, str], Any] | None = None,
        parallel: int = DOWNLOADS,
    ) -> list[Any]:
        """Whole objects into files in the items' order: the first alone, then ``parallel`` at
        a time.

        Each destination is written once per node (its lock, module notes); a file at
        ``dest`` is always whole. ``then(dest, key)`` runs on a thread as each object is
        present (downloaded here or by another process), under its lock, while the others
        still arrive (e.g. indexing a shard and saving its index); its results come back
        in the items' order. A ``then`` with ``scanner(key, size)`` is given what it returns
        (``feed(pos, piece)``, fed each piece as it is written, in order: a shard indexed
        as it streams in) as ``then(dest, key, scan)`` for an object downloaded here in one
        stream. One object failing does not stop the others: the call raises
        its error once they are done. No bound on the whole call: progress is bounded per
        piece.
        """
        # the first object alone (it lands at the whole bandwidth: a first batch that needs
        # it waits for one object, not for ``parallel`` sharing the link), then ``parallel``
        slots = asyncio.Semaphore(1)
        ramp = [max(1, parallel) - 1]
        scanner = getattr(then, "scanner", None)

        async def one(key: str, dest: str, size: int, etag: str | None) -> Any:
            loop = asyncio.get_running_loop()
            async with slots:
                held = await loop.run_in_executor(None, locks.lock, dest + ".lock")
                try:
                    scan = None
                    if not os.path.exists(dest):
                        if scanner is not None and len(chunks(size)) == 1:  # bytes in order
                            scan = scanner(key, size)
                        await self._download(key, dest, size, etag, scan)
                    self._flush()  # type: ignore[attr-defined]
                    if then is None:
                        return None
                    args = (dest, key) if scan is None else (dest, key, scan)
                    return await loop.run_in_executor(None, then, *args)
                finally:
                    locks.unlock(held)
                    for _ in range(ramp[0]):  # the first is done (or failed): the others
                        slots.release()
                    ramp[0] = 0

        async def all_downloads() -> list[Any]:
            self._semaphore()  # type: ignore[attr-defined]
            # one failure does not stop the others: what completes is kept (and indexed)
            got = await asyncio.gather(*(one(*item) for item in items), return_exceptions=True)
            failed = [r for r in got if isinstance(r, BaseException)]
            if failed:
                raise failed[0]
            return list(got)

        try:
            return self._run(all_downloads(), None)  # type: ignore[attr-defined]
        finally:
            self._flush()  # type: ignore[attr-defined]

    # Internals --------------------------------------------------------------------
    async def _download(
        self, key: str, dest: str, size: int, etag: str | None, scan: Any = None
    ) -> None:
        part = f"{dest}.part.{os.getpid()}"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            if size:
                os.ftruncate(fd, size)
            await asyncio.gather(
                *(self._stream_into(fd, key, a, b, etag, scan) for a, b in chunks(size))
            )
        except BaseException:
            os.close(fd)
            os.unlink(part)
            raise
        os.close(fd)
        os.replace(part, dest)

    async def _stream_into(
        self, fd: int, key: str, start: int, end: int, etag: str | None, scan: Any = None
    ) -> None:
        """Bytes ``[start, end)`` of ``key`` written at the same offsets of ``fd`` as they arrive
        (and fed to ``scan``, in order, as each is written).

        A stream that fails part way is resumed from the first byte not yet written
        (each attempt counts as a request); one that makes no progress for the
        configured timeout is cut and retried.
        """
        import obstore

        pos = start
        timeout = self.settings.timeout

        async def attempt() -> None:
            nonlocal pos
            result = await obstore.get_async(self.client, key, options={"range": (pos, end)})
            self._check_etag(key, etag, result.meta)
            stream = result.stream(min_chunk_size=STREAM_PIECE)
            while pos < end:
                try:
                    piece = await asyncio.wait_for(anext(stream), timeout)
                except StopAsyncIteration:
                    raise ConnectionError(
                        f"short read: stream ended at byte {pos} of {end}"
                    ) from None
                os.pwrite(fd, piece, pos)
                if scan is not None:
                    scan.feed(pos, piece)
                pos += len(piece)
                self._count("bytes", len(piece))  # type: ignore[attr-defined]

        if end > start:
            await self._retrying(key, attempt, self._sem, limit=None)  # type: ignore[attr-defined]

    def _check_etag(self, key: str, etag: str | None, meta: Any) -> None:
        got = str(meta.get("e_tag") or "")
        if etag and got and got != etag:
            raise ObjectChangedError(
                f"shard {key!r} in {self.settings.url} changed since it was indexed "
                f"(ETag {etag}, now {got}): make the dataset again to re-index it",
                key=key,
                store=self.settings.url,
            )

    async def _range(self, key: str, start: int, end: int, etag: str | None) -> bytes:
        import obstore

        if end <= start:
            return b""

        async def attempt() -> bytes:
            result = await obstore.get_async(self.client, key, options={"range": (start, end)})
            self._check_etag(key, etag, result.meta)
            data = bytes(await result.bytes_async())
            if len(data) != end - start:
                raise ConnectionError(f"short read: {len(data)} of {end - start} bytes")
            return data

        data = await self._retrying(key, attempt, self._sem)  # type: ignore[attr-defined]
        self._count("bytes", len(data))  # type: ignore[attr-defined]
        return data
