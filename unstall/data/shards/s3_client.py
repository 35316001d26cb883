"""One process's S3 client for shards: listings with size + ETag, ranged GETs, whole downloads.

Shards are large, so the unit of work is a byte range: a whole shard is
fetched as ranges of up to ``CHUNK`` bytes (one GET for a 64 MiB shard), each
streamed into a local file with ``pwrite`` as its bytes arrive, every shard in
flight at once; a batch's samples from a shard that is not kept locally are
read as a few coalesced ranges. Every answer's ETag is checked
against the one the index was built from, so a rewritten shard is never read
at stale offsets. As in `unstall.stores.s3_client`, a process builds its own
client and never one whose runtime it inherited (obstore does not survive fork).
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import threading
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from unstall.errors import StoreError
from unstall.stores import obstore_runtime
from unstall.stores.s3_config import S3Settings
from unstall.stores.s3_errors import classify, short
from unstall.stores.s3_stats import SharedStats

T = TypeVar("T")
#: Bytes per ranged GET when a whole shard is downloaded, streamed (measured here through
#: the latency proxy, 3 shards of 64 MiB: one streamed GET each 0.20-0.23 s, 8 MiB ranges
#: 0.37-0.54 s: every extra request and its buffered copy costs CPU in client and server).
CHUNK = 64 << 20
#: Bytes a stream hands over at a time (written with one ``pwrite``).
STREAM_PIECE = 1 << 20
#: GETs in flight per process.
INFLIGHT = 32


def chunks(size: int) -> list[tuple[int, int]]:
    """``size`` bytes as equal ranges of about ``CHUNK`` (a shard a little over k chunks,
    such as a 64 MiB shard plus its tar padding, takes k GETs, not k + 1)."""
    parts = max(1, math.ceil(size / CHUNK - 0.25))
    step = -(-size // parts)
    return [(a, min(a + step, size)) for a in range(0, size, step)] if size else []


class ShardChangedError(StoreError):
    """A shard's ETag (or size) differs from the one its index was built from."""


class ShardClient:
    """obstore on an asyncio loop in a background thread of this process."""

    def __init__(self, settings: S3Settings, stats: SharedStats):
        parent = obstore_runtime.inherited()
        if parent is not None:
            raise StoreError(
                f"obstore was used in process {parent}, the parent of process {os.getpid()}; "
                "its runtime does not survive fork(): use workers, or "
                "multiprocessing_context='spawn'",
                store=settings.url,
            )
        from obstore.store import S3Store as ObStore

        obstore_runtime.claim()
        self.settings, self.stats, self.pid = settings, stats, os.getpid()
        kwargs = settings.obstore_kwargs(pid=self.pid)
        # a whole-shard stream may take longer than one request's timeout: stalls are caught
        # per piece (`_stream_into`) and per small request (`_retrying`); this is a ceiling
        kwargs["client_options"]["timeout"] = timedelta(seconds=settings.timeout + CHUNK / 2**20)
        self.client = ObStore(settings.bucket, **kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name=f"unstall-shards-{self.pid}", daemon=True
        )
        self._thread.start()
        self._sem: asyncio.Semaphore | None = None

    # Public -----------------------------------------------------------------------
    def list(self, prefix: str) -> list[tuple[str, int, str]]:
        """(key, size, ETag) of every object under ``prefix`` (keys relative to the store)."""
        import obstore

        async def listing() -> list[tuple[str, int, str]]:
            out: list[tuple[str, int, str]] = []
            pages = 0
            async for chunk in obstore.list(self.client, prefix=prefix or None, chunk_size=1000):
                pages += 1
                out.extend((m["path"], int(m["size"]), str(m.get("e_tag") or "")) for m in chunk)
            self.stats.add(list_requests=max(pages, 1))
            return out

        return self._run(self._retrying(f"listing {prefix or '(all)'}", listing))

    def head_many(self, keys: list[str]) -> list[tuple[int, str]]:
        """(size, ETag) of each key, many requests in flight."""
        import obstore

        async def one(key: str) -> tuple[int, str]:
            async def attempt() -> tuple[int, str]:
                meta = await obstore.head_async(self.client, key)
                return int(meta["size"]), str(meta.get("e_tag") or "")

            return await self._retrying(key, attempt)

        async def all_heads() -> list[tuple[int, str]]:
            return list(await asyncio.gather(*(one(k) for k in keys)))

        return self._run(all_heads())

    def read_ranges(
        self, items: list[tuple[str, list[tuple[int, int]], str | None]]
    ) -> list[list[bytes]]:
        """For each ``(key, [(start, end), ...], ETag)``, the bytes of its ranges; all in flight."""

        async def one(key: str, ranges: list[tuple[int, int]], etag: str | None) -> list[bytes]:
            return list(await asyncio.gather(*(self._range(key, a, b, etag) for a, b in ranges)))

        async def all_ranges() -> list[list[bytes]]:
            return list(await asyncio.gather(*(one(*item) for item in items)))

        return self._run(all_ranges())

    def download_many(
        self,
        items: list[tuple[str, str, int, str | None]],
        then: Callable[[str, str], Any] | None = None,
    ) -> list[Any]:
        """Fetch whole shards ``(key, dest path, size, ETag)`` into files, all in flight.

        Each is written to ``dest + ".part"`` and renamed when complete, so a file at
        ``dest`` is always a whole shard. ``then(dest, key)`` runs on a thread as each
        shard completes, while the others still arrive (e.g. indexing it); the results
        come back in the items' order.
        """

        async def one(key: str, dest: str, size: int, etag: str | None) -> Any:
            part = f"{dest}.part.{os.getpid()}"
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if size:
                    os.ftruncate(fd, size)
                await asyncio.gather(
                    *(self._stream_into(fd, key, a, b, etag) for a, b in chunks(size))
                )
            except BaseException:
                os.close(fd)
                os.unlink(part)
                raise
            os.close(fd)
            os.replace(part, dest)
            if then is None:
                return None
            return await asyncio.get_running_loop().run_in_executor(None, then, dest, key)

        async def all_downloads() -> list[Any]:
            return list(await asyncio.gather(*(one(*item) for item in items)))

        return self._run(all_downloads(), bounded=False)  # progress is bounded per piece

    def close(self) -> None:
        if self.pid == os.getpid() and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)

    # Internals --------------------------------------------------------------------
    def _run(self, coro: Awaitable[T], *, bounded: bool = True) -> T:
        s = self.settings
        bound = (s.retries + 1) * (s.timeout + 1.0 + s.max_backoff_s) * 4 + 30
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return future.result(timeout=bound if bounded else None)
        except TimeoutError:
            future.cancel()
            raise StoreError(
                f"shard requests to {s.url} did not finish within {bound:.0f} s", store=s.url
            ) from None

    async def _stream_into(self, fd: int, key: str, start: int, end: int, etag: str | None) -> None:
        """Bytes ``[start, end)`` of ``key`` written at the same offsets of ``fd`` as they arrive.

        A stream that fails part way is resumed from the first byte not yet written
        (each attempt counts as a request); one that makes no progress for the
        configured timeout is cut and retried.
        """
        import obstore

        pos = start
        s = self.settings

        async def attempt() -> None:
            nonlocal pos
            result = await obstore.get_async(self.client, key, options={"range": (pos, end)})
            self._check_etag(key, etag, result.meta)
            self.stats.add(requests=1)
            stream = result.stream(min_chunk_size=STREAM_PIECE)
            while pos < end:
                try:
                    piece = await asyncio.wait_for(anext(stream), s.timeout)
                except StopAsyncIteration:
                    raise ConnectionError(
                        f"short read: stream ended at byte {pos} of {end}"
                    ) from None
                os.pwrite(fd, piece, pos)
                pos += len(piece)
                self.stats.add(bytes=len(piece))

        if end > start:
            await self._retrying(key, attempt, limit=None)

    def _check_etag(self, key: str, etag: str | None, meta: Any) -> None:
        got = str(meta.get("e_tag") or "")
        if etag and got and got != etag:
            raise ShardChangedError(
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

        data = await self._retrying(key, attempt)
        self.stats.add(requests=1, bytes=len(data))
        return data

    async def _retrying(
        self, key: str, attempt: Callable[[], Awaitable[T]], *, limit: float | None = -1.0
    ) -> T:
        """``attempt()`` until it succeeds, a retryable failure at most ``retries`` times;
        each attempt bounded by ``limit`` seconds (default: the timeout + 1 s; None: itself)."""
        s = self.settings
        if limit is not None and limit < 0:
            limit = s.timeout + 1.0
        if self._sem is None:
            self._sem = asyncio.Semaphore(s.max_inflight or INFLIGHT)
        last: BaseException | None = None
        for n in range(s.retries + 1):
            if n:
                self.stats.add(retries=1)
                await asyncio.sleep(random.uniform(0, min(s.max_backoff_s, s.backoff_s * 2**n)))
            try:
                async with self._sem:
                    return await asyncio.wait_for(attempt(), limit)
            except ShardChangedError:
                raise
            except Exception as exc:
                kind = classify(exc)
                if kind != "retry":
                    self.stats.add(errors=1)
                    raise StoreError(
                        f"shard {key!r} in {s.where(key)}: {short(exc)}", key=key, store=s.url
                    ) from exc
                last = exc
        self.stats.add(errors=1)
        raise StoreError(
            f"giving up on shard {key!r} ({s.where(key)}) after {s.retries + 1} attempts: "
            f"{short(last) if last else 'unknown'}",
            key=key,
            store=s.url,
        ) from last


def child_call(settings: S3Settings, stats: SharedStats, op: str, *args: Any) -> Any:
    """Run ``ShardClient.<op>(*args)`` in a forked child, so this process never uses obstore.

    The process that builds a dataset forks loader workers later; had it made
    requests itself, their clients would hang (see `unstall.stores.obstore_runtime`).
    """
    return fork_call(f"{op} on {settings.url}", _with_client, settings, stats, op, *args)


def fork_call(what: str, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a forked child (which may make requests: it builds its own clients);
    its result or exception comes back pickled. ``what`` names it in errors."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(fn, args, send), daemon=True)
    proc.start()
    send.close()
    try:
        if not recv.poll(3600):
            raise StoreError(f"shard helper for {what} did not answer in 1 h")
        ok, value = recv.recv()
    except EOFError:
        raise StoreError(
            f"shard helper process {proc.pid} for {what} died (exit code {proc.exitcode})"
        ) from None
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
    if not ok:
        raise value
    return value


def _with_client(settings: S3Settings, stats: SharedStats, op: str, *args: Any) -> Any:
    client = ShardClient(settings, stats)
    try:
        return getattr(client, op)(*args)
    finally:
        client.close()


def _child(fn: Callable[..., Any], args: tuple, send: Any) -> None:
    try:
        result = (True, fn(*args))
    except BaseException as exc:  # sent back and raised in the caller
        result = (False, exc)
    try:
        send.send(result)
    except Exception as exc:  # an exception that does not pickle: send its text
        send.send((False, StoreError(f"{type(result[1]).__name__}: {result[1]} ({exc})")))
    send.close()
    os._exit(0)  # no atexit handlers or finalizers of the parent's objects run here
