"""Reading items from peer nodes: obstore `HTTPStore` GETs, many in flight, no retries.

One `PeerClient` per process (made lazily after fork, as obstore's runtime does
not survive it), with its own asyncio loop thread. Each request has a short
timeout and no retry: a peer that refuses, hangs, dies or answers wrongly costs
one timeout, is then skipped for ``skip_s``, and its items come from storage.
The body is checked against the ``ETag`` (size and CRC-32) the server sent.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
import zlib
from datetime import timedelta
from typing import Any


class PeerClient:
    """GETs of ``(node, index)`` items from peers' servers; ``None`` for each one that failed."""

    def __init__(self, addresses: dict[int, str], token: str, timeout_s: float, skip_s: float):
        self.addresses, self.timeout_s, self.skip_s = addresses, timeout_s, skip_s
        self._token = token
        self._stores: dict[tuple[int, str], Any] = {}
        self._skip_until: dict[int, float] = {}
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="unstall-peers", daemon=True).start()

    def _store(self, node: int, fingerprint: str) -> Any:
        store = self._stores.get((node, fingerprint))
        if store is None:
            from obstore.store import HTTPStore

            t = self.timeout_s
            store = HTTPStore.from_url(
                f"http://{self.addresses[node]}/v1/{fingerprint}",
                client_options={
                    "allow_http": True,
                    "timeout": timedelta(seconds=t),
                    "connect_timeout": timedelta(seconds=min(t, 1.0)),
                    "default_headers": {"authorization": f"Bearer {self._token}"},
                },
                retry_config={"max_retries": 0, "retry_timeout": timedelta(seconds=t)},
            )
            self._stores[(node, fingerprint)] = store
        return store

    def usable(self, node: int) -> bool:
        return self._skip_until.get(node, 0.0) <= time.monotonic()

    def get_many(self, fingerprint: str, wanted: list[tuple[int, int]]) -> list[bytes | None]:
        """Bytes of each ``(node, index)``; ``None`` where the peer failed (it is then skipped)."""
        coro = self._gather(fingerprint, wanted)
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:  # every request has its own timeout; this bound is only a backstop
            return future.result(timeout=self.timeout_s * 2 + 5.0)
        except concurrent.futures.TimeoutError:
            future.cancel()
            for node, _ in wanted:
                self._skip(node)
            return [None] * len(wanted)

    async def _gather(self, fingerprint: str, wanted: list[tuple[int, int]]) -> list[Any]:
        return list(await asyncio.gather(*(self._one(fingerprint, n, i) for n, i in wanted)))

    async def _one(self, fingerprint: str, node: int, index: int) -> bytes | None:
        import obstore

        if not self.usable(node):
            return None
        try:
            result = await obstore.get_async(self._store(node, fingerprint), str(index))
            raw = bytes(await result.bytes_async())
            etag = result.meta.get("e_tag") or ""
        except Exception:
            self._skip(node)
            return None
        if etag != f'"{len(raw)}-{zlib.crc32(raw):08x}"':  # truncated or altered answer
            self._skip(node)
            return None
        return raw

    def _skip(self, node: int) -> None:
        self._skip_until[node] = time.monotonic() + self.skip_s
