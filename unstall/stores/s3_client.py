"""One process's S3 client: obstore requests on an asyncio loop in a background thread.

`Fetcher` keeps up to ``max_inflight`` GETs in flight for a whole batch, keeps
the keys' order, retries timeouts, dropped connections, 5xx and throttling with
exponential backoff and full jitter, and maps 404/403 to `MissingKeyError` /
`AccessDeniedError` at once. Each result is written to its key's slot only
when its attempt succeeded, so a retry can neither lose nor duplicate a sample.

obstore's tokio runtime does not survive ``fork()``: a process may build a
`Fetcher` only if no ancestor built one (see `unstall.stores.s3_helper`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import math
import os
import random
import statistics
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from unstall.errors import AccessDeniedError, MissingKeyError, StoreError
from unstall.stores import obstore_runtime
from unstall.stores.s3_config import S3Settings
from unstall.stores.s3_errors import classify, range_refused, short
from unstall.stores.s3_ranges import CHUNK, RangeOps
from unstall.stores.s3_stats import SharedStats

T = TypeVar("T")
MIN_INFLIGHT, MAX_INFLIGHT = 16, 256
#: Look-ahead GETs kept at most, as a multiple of the keys of the largest `prefetch` call.
AHEAD_KEEP = 2
_COUNTS = ("requests", "retries", "errors", "bytes", "prefetched", "queued")
PROBES = 3
#: The end of a byte range that covers any object: a ranged GET of [0, WHOLE) is the whole object.
WHOLE = 1 << 62


class Fetcher(RangeOps):
    """The in-process client of one store in one process; built lazily, never shared.

    Byte ranges and whole-object downloads (`RangeOps`) use the same client and retry rule.
    """

    def __init__(self, settings: S3Settings, stats: SharedStats):
        pid = os.getpid()
        parent = obstore_runtime.inherited()
        if parent is not None:
            raise StoreError(
                f"obstore was used in process {parent}, the parent of this forked "
                f"process {pid}, and its runtime does not survive fork(); create S3Store "
                "with in_process=False (the default) in the parent, or use "
                "multiprocessing_context='spawn'",
                store=settings.url,
            )
        from obstore.store import S3Store as ObStore

        obstore_runtime.claim()
        self.settings = settings
        self.stats = stats
        self.pid = pid
        kwargs = settings.obstore_kwargs(pid=pid)
        # a whole-object stream (`RangeOps.download_many`) may take longer than one request's
        # timeout: every attempt is bounded here (`_retrying`), a stream per piece; this is a
        # ceiling
        kwargs["client_options"]["timeout"] = timedelta(seconds=settings.timeout + CHUNK / 2**20)
        self.client = ObStore(settings.bucket, **kwargs)
        self.max_inflight = settings.max_inflight
        self.latency_s: float | None = None
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._loop.run_forever, name=f"unstall-s3-{pid}", daemon=True
        )
        self._loop_thread.start()
        self._sem: asyncio.Semaphore | None = None
        self._sem_size = 0
        self._counts = dict.fromkeys(_COUNTS, 0)
        self._counts_lock = threading.Lock()  # the loop thread adds, the caller's thread flushes
        #: Look-ahead GETs started by `prefetch`, oldest first, with the number of the call
        #: that started each; touched on the loop thread only.
        self._ahead: OrderedDict[str, tuple[asyncio.Task[bytes], int]] = OrderedDict()
        self._ahead_calls = 0
        self._ahead_most = 0  # keys in the largest hint so far: the bound is a multiple of it
        self._ranged = True  # whole objects by one ranged GET, until the server ignores ranges

    # Public, called from any thread of this process -----------------------------
    def get_many(self, keys: list[str]) -> list[bytes]:
        """Bytes of every key, in order, with up to ``max_inflight`` requests in flight."""
        t0 = time.perf_counter()
        self._follow_limit()
        results: list[bytes | None] = [None] * len(keys)
        try:
            start = self._probe(keys, results) if self.max_inflight is None else 0
            if start < len(keys):
                rounds = math.ceil((len(keys) - start) / (self.max_inflight or 1))
                self._run(self._fetch_all(keys, results, start), rounds)
        finally:
            self._flush(get_s=time.perf_counter() - t0)
        return results  # type: ignore[return-value]  # every slot was filled or we raised

    def prefetch(self, keys: list[str]) -> None:
        """Start GETs for ``keys`` now, in order, and return at once; `get_many` claims them.

        A hint: keys asked for later are served from these requests (sharing the
        ``max_inflight`` bound with every other request). At most ``AHEAD_KEEP`` times
        the largest hint's length of unclaimed ones are kept; older ones are cancelled. Before the
        first `get_many` has measured the latency, nothing is started.
        """
        self._follow_limit()
        if self.max_inflight is not None and keys:
            self._loop.call_soon_threadsafe(self._start_ahead, list(keys))

    def _follow_limit(self) -> None:
        """Take the requests-in-flight limit the store's owner set (`S3Store.set_inflight`),
        if any: the semaphore is remade at the new size on the loop's next use."""
        limit = int(self.stats.get("inflight_limit"))
        if limit > 0 and limit != self.max_inflight:
            self.max_inflight = limit
            self.stats.set(max_inflight=limit)

    def list(self, prefix: str) -> list[str]:
        """Every key under ``prefix`` (relative to the store's prefix)."""
        import obstore

        async def listing() -> list[str]:
            keys: list[str] = []
            pages = 0
            async for chunk in obstore.list(self.client, prefix=prefix or None, chunk_size=1000):
                pages += 1
                keys.extend(meta["path"] for meta in chunk)
            self.stats.add(list_requests=max(pages, 1))
            return keys

        return self._run(self._retrying(f"listing {prefix or '(all)'}", listing, count=False), 1)

    def list_entries(self, prefix: str) -> list[tuple[str, int, str, int]]:
        """``(key, size, etag, mtime_ns)`` of every object under ``prefix``."""
        import obstore

        async def listing() -> list[tuple[str, int, str, int]]:
            rows: list[tuple[str, int, str, int]] = []
            pages = 0
            async for chunk in obstore.list(self.client, prefix=prefix or None, chunk_size=1000):
                pages += 1
                for meta in chunk:
                    when = meta.get("last_modified")
                    mtime_ns = int(when.timestamp() * 1e9) if when is not None else 0
                    etag = meta.get("e_tag") or ""
                    rows.append((meta["path"], int(meta["size"]), etag, mtime_ns))
            self.stats.add(list_requests=max(pages, 1))
            return rows

        return self._run(self._retrying(f"listing {prefix or '(all)'}", listing, count=False), 1)

    def put(self, key: str, data: bytes) -> None:
        import obstore

        async def one() -> None:
            await obstore.put_async(self.client, key, data)

        self._run(self._retrying(key, one), 1)
        self._flush()

    def put_many(self, items: list[tuple[str, bytes]]) -> None:
        """Upload many objects with ``max_inflight`` (or 32) requests in flight."""
        import obstore

        async def all_puts() -> None:
            sem = asyncio.Semaphore(self.max_inflight or 32)

            async def one(key: str, data: bytes) -> None:
                async with sem:
                    await self._retrying(key, lambda: obstore.put_async(self.client, key, data))

            await asyncio.gather(*(one(k, d) for k, d in items))

        self._run(all_puts(), math.ceil(len(items) / (self.max_inflight or 32)))
        self._flush()

    def close(self) -> None:
        """Stop the loop thread (only from the process that made it); safe to call twice."""
        if self.pid == os.getpid() and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._loop_thread.join(timeout=5)

    # Internals -----------------------------------------------------------------
    def _probe(self, keys: list[str], results: list[bytes | None]) -> int:
        """Fetch the first keys one at a time to measure latency; size ``max_inflight`` by it.

        Little's law: requests in flight = rate x latency, so aiming at
        ``target_rate`` requests/s needs ``target_rate * latency`` in flight.
        """
        times = []
        n = min(PROBES, len(keys))
        for i in range(n):
            t0 = time.perf_counter()
            results[i] = self._run(self._fetch_one(keys[i]), 1)
            times.append(time.perf_counter() - t0)
        self.latency_s = statistics.median(times)
        wanted = math.ceil(self.settings.target_rate * self.latency_s)
        self.max_inflight = max(MIN_INFLIGHT, min(MAX_INFLIGHT, wanted))
        self.stats.set(latency_ms=self.latency_s * 1000, max_inflight=self.max_inflight)
        return n

    def _run(self, coro: Awaitable[T], rounds: int | None) -> T:
        """Run ``coro`` on the loop thread; bounded, so a stuck request cannot hang a worker
        (``rounds=None``: unbounded, for work whose progress is bounded piece by piece)."""
        s = self.settings
        per_key = (s.retries + 1) * (s.timeout + 1.0 + s.max_backoff_s)
        deadline = None if rounds is None else rounds * per_key + 5.0
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]
        try:
            return future.result(timeout=deadline)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise StoreError(
                f"requests to {s.url} did not finish within {deadline:.0f} s "
                f"(timeout={s.timeout} s x {s.retries + 1} attempts); check the endpoint "
                f"{s.endpoint or '(AWS)'}",
                store=s.url,
            ) from None

    def _start_ahead(self, keys: list[str]) -> None:
        """On the loop thread: a task per key not already started; the oldest beyond the bound
        are cancelled (their results were not claimed: the order changed, or the epoch ended)."""
        self._semaphore()
        ahead = self._ahead
        self._ahead_calls += 1
        self._ahead_most = max(self._ahead_most, len(keys))
        for key in keys:
            if key in ahead:
                ahead.move_to_end(key)
                continue
            task = self._loop.create_task(self._fetch_one(key))
            task.add_done_callback(_consume)
            ahead[key] = (task, self._ahead_calls)
        while len(ahead) > AHEAD_KEEP * self._ahead_most:
            ahead.popitem(last=False)[1][0].cancel()

    def _semaphore(self) -> asyncio.Semaphore:
        """The bound on this process's requests in flight, made on the loop thread on first use."""
        size = self.max_inflight or MIN_INFLIGHT
        if self._sem is None or self._sem_size != size:  # requests holding the old one finish
            self._sem, self._sem_size = asyncio.Semaphore(size), size
        return self._sem

    async def _fetch_all(self, keys: list[str], results: list[bytes | None], start: int) -> None:
        self._semaphore()
        ahead = self._ahead

        async def one(i: int) -> None:
            started = ahead.pop(keys[i], None)
            if started is None:
                results[i] = await self._fetch_one(keys[i])
                return
            task, call = started
            results[i] = await task
            if call < self._ahead_calls:  # started for an earlier batch: fetched ahead
                self._count("prefetched", 1)

        tasks = [asyncio.ensure_future(one(i)) for i in range(start, len(keys))]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:  # on the first failure, or if the caller gave up: stop the rest
            for task in tasks:
                if not task.done():
                    task.cancel()
        for task in tasks:  # the first failure in key order, so the message is stable
            if task in done and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _fetch_one(self, key: str) -> bytes:
        import obstore

        async def attempt() -> bytes:
            if self._ranged:
                # One call into the client instead of two (get, then read the body): about
                # 30 % less client CPU per object (measured: 0.29 vs 0.42 ms for 75 KB).
                # An open-ended range is the whole object (RFC 9110: the end is clamped).
                try:
                    data = await obstore.get_range_async(self.client, key, start=0, end=WHOLE)
                    return bytes(data)
                except Exception as exc:
                    refused = range_refused(exc)
                    if refused is None:
                        raise
                    if refused == "ignored":  # the server does not do ranges: plain GETs on
                        self._ranged = False
                    self._count("requests", 1)  # the plain GET below; 416 is per (empty) object
            result = await obstore.get_async(self.client, key)
            return bytes(await result.bytes_async())

        data = await self._retrying(key, attempt, self._sem)
        self._count("bytes", len(data))
        return data

    async def _retrying(
        self,
        key: str,
        attempt: Callable[[], Awaitable[T]],
        sem: asyncio.Semaphore | None = None,
        *,
        limit: float | None = -1.0,
        count: bool = True,
    ) -> T:
        """``attempt()`` until it succeeds, a retryable failure at most ``retries`` times, with
        exponential backoff and full jitter: the one retry rule of every S3 request. Each
        attempt is bounded by ``limit`` seconds (default the timeout + 1 s; None: by itself,
        as a stream checks its own progress); ``count``: attempts count as requests."""
        s = self.settings
        if limit is not None and limit < 0:
            limit = s.timeout + 1.0
        last: BaseException | None = None
        last_desc = "none"
        for n in range(s.retries + 1):
            if n:
                self._count("retries", 1)
                cap = min(s.max_backoff_s, s.backoff_s * 2 ** (n - 1))
                await asyncio.sleep(random.uniform(0, cap))  # full jitter
            if count:
                self._count("requests", 1)
            t0 = time.perf_counter()
            if sem is not None and sem.locked():  # the limit binds: a tuner raises it
                self._count("queued", 1)
            try:
                async with sem or contextlib.nullcontext():
                    return await (attempt() if limit is None else _within(attempt(), limit))
            except (asyncio.CancelledError, StoreError):  # StoreError: ours, already final
                raise
            except Exception as exc:
                kind = classify(exc)
                if kind != "retry":
                    self._count("errors", 1)
                    raise self._error(kind, key, exc) from exc
                last, last_desc = exc, short(exc)
                if time.perf_counter() - t0 >= 0.9 * s.timeout:
                    last_desc = f"timed out after timeout={s.timeout} s ({last_desc})"
        self._count("errors", 1)
        raise StoreError(
            f"giving up on key {key!r} in bucket {s.bucket!r} ({s.where(key)}) after "
            f"{s.retries + 1} attempts; last error: {last_desc}. Raise `retries` or "
            "`timeout` (or UNSTALL_S3_RETRIES / UNSTALL_S3_TIMEOUT) if the server is just slow",
            key=key,
            store=s.url,
        ) from last

    def _error(self, kind: str, key: str, exc: BaseException) -> StoreError:
        s = self.settings
        if kind == "missing":
            return MissingKeyError(
                f"key {key!r} not found in bucket {s.bucket!r} ({s.where(key)}); check the "
                "key and prefix, or refresh a stale manifest with `list_cached(refresh=True)`",
                key=key,
                store=s.url,
            )
        if kind == "denied":
            return AccessDeniedError(
                f"access denied to key {key!r} in bucket {s.bucket!r} ({s.where(key)}): "
                f"{short(exc)}; check the credentials (AWS_ACCESS_KEY_ID, AWS_PROFILE) and "
                "the bucket's policy",
                key=key,
                store=s.url,
            )
        return StoreError(
            f"request for key {key!r} in bucket {s.bucket!r} ({s.where(key)}) failed and is "
            f"not retryable: {short(exc)}",
            key=key,
            store=s.url,
        )

    def _count(self, name: str, n: int) -> None:
        with self._counts_lock:
            self._counts[name] += n

    def _flush(self, **extra: float) -> None:
        with self._counts_lock:
            counts, self._counts = self._counts, dict.fromkeys(_COUNTS, 0)
        self.stats.add(**counts, **extra)


async def _within(coro: Awaitable[T], seconds: float) -> T:
    """``await coro`` for at most ``seconds``; on 3.11+ without wait_for's extra task per call."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(seconds):
            return await coro
    return await asyncio.wait_for(coro, seconds)


def _consume(task: asyncio.Task[bytes]) -> None:
    """Mark a look-ahead task's outcome as seen: an unclaimed failure is not an error."""
    if not task.cancelled():
        task.exception()
