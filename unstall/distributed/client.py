"""Reading items from peer nodes: obstore `HTTPStore` GETs, many in flight, no retries.

One `PeerClient` per loader, built where the cache is bound (the main process,
before workers fork): an `HTTPStore` (one per peer) costs 8 ms to build, and
50-270 ms per fresh worker on a busy host, every epoch without persistent
workers. A store never used survives ``fork()``; obstore's runtime does not, so
a process whose ancestor made obstore requests reads storage instead (one
warning). The GETs are obstore's blocking calls on a small thread pool (the GIL
is released while a request is in flight): measured here, 138 us of CPU per
64 KiB item against 325 us through obstore's asyncio bridge. Each request has a
short timeout and no retry: a peer that refuses, hangs, dies or answers wrongly
costs one timeout, is then skipped until the loader's next epoch (or for
``skip_s``), and its items come from storage: a node that comes back rejoins at
an epoch boundary. The body's length is checked against the size in the ``ETag``.
A peer with a certificate is read over HTTPS, its store trusting that one
certificate (pinned, see `tls`); a peer without one over plain HTTP.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import time
from collections.abc import Callable
from datetime import timedelta

from unstall.stores import obstore_runtime

log = logging.getLogger("unstall.distributed")
#: GETs in flight per process (a batch's peer items are fetched together).
THREADS = 16


class PeerClient:
    """GETs of ``(node, index)`` items from peers' servers; ``None`` for each one that failed."""

    def __init__(
        self,
        addresses: dict[int, str],
        token: str,
        timeout_s: float,
        skip_s: float | None,
        *,
        fingerprint: str,
        node: int,
        generation: Callable[[], int],
        certificates: dict[int, str | None],
    ):
        from obstore.store import HTTPStore

        self.addresses, self.timeout_s, self.skip_s = addresses, timeout_s, skip_s
        self._generation = generation
        t = timeout_s
        # the connection's limit is the request's: over TLS (the default) the connect phase
        # includes the handshake, answered by the peer's server thread, and a node slowed
        # for a second by its own work was taken for lost under a 1 s cap (its items then
        # read from storage twice), whatever `timeout_s` the user gave
        options = {
            "timeout": timedelta(seconds=t),
            "connect_timeout": timedelta(seconds=t),
            "default_headers": {"authorization": f"Bearer {token}"},
        }
        retry = {"max_retries": 0, "retry_timeout": timedelta(seconds=t)}
        self._stores = {}
        for n, address in addresses.items():
            if n == node:
                continue
            cert = certificates.get(n)
            if cert is None:  # plain HTTP: Peers(tls=False) on every node
                url, extra = f"http://{address}", {"allow_http": True}
            else:  # exactly this certificate, for this address (its SAN)
                url, extra = f"https://{address}", {"root_certificate": cert}
            self._stores[n] = HTTPStore.from_url(
                f"{url}/v1/{fingerprint}", client_options=options | extra, retry_config=retry
            )
        #: node -> (epoch generation, monotonic time) of its last failure in this process
        self._failed: dict[int, tuple[int, float]] = {}
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._pid = -1

    def _threads(self) -> concurrent.futures.ThreadPoolExecutor | None:
        """This process's request threads; None if an ancestor used obstore (it would hang)."""
        if self._pid != os.getpid():
            parent = obstore_runtime.inherited()
            if parent is not None:
                log.warning(
                    "peer reads off in process %d: obstore was used in its parent %d and its "
                    "runtime does not survive fork(); peers' items come from storage (use "
                    "num_workers > 0, or multiprocessing_context='spawn')",
                    os.getpid(),
                    parent,
                )
                self._pool = None
            else:
                obstore_runtime.claim()
                self._pool = concurrent.futures.ThreadPoolExecutor(THREADS, "unstall-peers")
            self._pid = os.getpid()
        return self._pool

    def usable(self, node: int) -> bool:
        """False while ``node`` is skipped: it failed in this epoch (and within ``skip_s``)."""
        failed = self._failed.get(node)
        if failed is None:
            return True
        generation, when = failed
        if generation != self._generation() or (
            self.skip_s is not None and time.monotonic() - when >= self.skip_s
        ):
            del self._failed[node]  # a new epoch (or skip_s passed): try it again
            return True
        return False

    def get_many(
        self, wanted: list[tuple[int, int]], versions: list[int] | None = None
    ) -> list[bytes | None]:
        """Bytes of each ``(node, index)``; ``None`` where the peer failed (it is then skipped)
        or holds another version of the item than ``versions`` (the item's source versions
        this node expects; None: unversioned)."""
        pool = self._threads()
        if pool is None:
            return [None] * len(wanted)
        expect = versions if versions is not None else [None] * len(wanted)
        futures = [
            pool.submit(self._one, n, i, v) for (n, i), v in zip(wanted, expect, strict=True)
        ]
        # every request has its own timeout; this bound is only a backstop
        deadline = time.monotonic() + self.timeout_s * 2 + 5.0
        out: list[bytes | None] = []
        for (node, _), future in zip(wanted, futures, strict=True):
            try:
                out.append(future.result(timeout=max(0.0, deadline - time.monotonic())))
            except concurrent.futures.TimeoutError:
                future.cancel()
                self._skip(node)
                out.append(None)
        return out

    def _one(self, node: int, index: int, version: int | None = None) -> bytes | None:
        import obstore

        if not self.usable(node):
            return None
        try:
            result = obstore.get(self._stores[node], str(index))
            raw = bytes(result.bytes())
            etag = result.meta.get("e_tag") or ""
        except Exception:
            self._skip(node)
            return None
        if etag != etag_of(raw, version):
            sized = etag == etag_of(raw) or etag.startswith(f'"{len(raw)}-')
            if not sized:  # a truncated or wrong-sized answer
                self._skip(node)
            return None  # the peer holds another version of the item: storage has ours
        return raw

    def _skip(self, node: int) -> None:
        self._failed[node] = (self._generation(), time.monotonic())

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=False, cancel_futures=True)


def etag_of(raw: bytes | memoryview, version: int | None = None) -> str:
    """The server's ``ETag`` for an item: its size, and the version of its source where the
    dataset has versions (`Store.versions`). No checksum: TCP checks the bytes, and
    CRC-32 of 64 KiB cost 20-33 us on each side, a sixth of a peer item's CPU."""
    return f'"{len(raw)}"' if version is None else f'"{len(raw)}-{version}"'
