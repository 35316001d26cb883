"""A node's peer server: HTTP GET of one item's raw bytes, straight from the node's cache.

One per node (run by local rank 0 on a thread of its own), serving every
dataset its process has bound, by fingerprint: ``GET /v1/<fingerprint>/<index>``.
Every request must carry ``Authorization: Bearer <job token>`` (compared in
constant time); anything else gets 401 and an empty body. An item the node owns
but has not cached yet is fetched from storage, cached, then served, so each
item is read from storage once for the whole cluster. The ``ETag`` is the
item's size and the version of its source (`unstall.cache.items.item_versions`):
the client checks the body's length, and drops an item of another version than it
expects (its own listing's): it reads that one from storage. With a certificate
(the default, see `tls`) it speaks TLS 1.3 only: a plain-HTTP request gets no answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import pickle
import threading
from typing import Any

from unstall.cache.items import versions_of
from unstall.distributed.client import etag_of
from unstall.distributed.tls import NodeCertificate, server_context

#: Threads that read the cache (and storage, on an owner's miss) for requests.
READ_THREADS = 8
_LAST_MODIFIED = "Thu, 01 Jan 2026 00:00:00 GMT"


class PeerServer:
    """An aiohttp server on ``host`` (port 0: any free one) in a daemon thread; HTTPS with
    ``certificate``, else plain HTTP."""

    def __init__(
        self, host: str, token: str, port: int = 0, certificate: NodeCertificate | None = None
    ):
        self.host, self.port = host, port
        self.certificate = certificate
        self._token = ("Bearer " + token).encode()
        self._datasets: dict[str, tuple[Any, Any, Any]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(READ_THREADS, "unstall-peer-read")
        self._loop = asyncio.new_event_loop()
        self._runner: Any = None
        self.served = 0

    def register(self, fingerprint: str, layer: Any, dataset: Any) -> None:
        """Serve ``dataset``'s items through a copy of ``layer`` (its own mappings and slots):
        a `unstall.cache.tiered.TieredLayer` (RAM, disk or RAM over disk)."""
        copy = pickle.loads(pickle.dumps(layer))  # our own object, never network data
        copy.peers = None  # the server reads this node's items only: cache, else storage
        copy.attach()  # map the tiers now, once: the read threads must not race to attach
        ram = copy.ram if copy.ram is not None and copy.ram.lock_free else None
        self._datasets[fingerprint] = (copy, ram, dataset)  # ram: hits served on the loop

    def start(self, timeout_s: float = 30.0) -> str:
        """Start serving; returns ``host:port``."""
        ready = concurrent.futures.Future()  # type: ignore[var-annotated]

        def run() -> None:
            asyncio.set_event_loop(self._loop)
            try:
                self._loop.run_until_complete(self._start())
                ready.set_result(None)
            except BaseException as exc:  # report bind errors to the caller
                ready.set_exception(exc)
                return
            self._loop.run_forever()

        threading.Thread(target=run, name="unstall-peer-server", daemon=True).start()
        ready.result(timeout=timeout_s)
        return f"{self.host}:{self.port}"

    async def _start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_get("/v1/{fp}/{index}", self._get, allow_head=False)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        ssl = None if self.certificate is None else server_context(self.certificate)
        site = web.TCPSite(self._runner, self.host, self.port, backlog=256, ssl_context=ssl)
        await site.start()
        self.port = self._runner.addresses[0][1]

    async def _get(self, request: Any) -> Any:
        from aiohttp import web

        got = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(got, self._token):
            return web.Response(status=401)
        entry = self._datasets.get(request.match_info["fp"])
        try:
            index = int(request.match_info["index"])
        except ValueError:
            index = -1
        if entry is None or not 0 <= index < len(entry[2]):
            return web.Response(status=404)
        layer, ram, dataset = entry
        versions = versions_of(dataset, [index])
        raw = None
        if ram is not None:  # lock-free RAM tier, mapped at register: a memcpy
            raw = ram.get_many([index], versions)[0][0]  # another version: a miss
        if raw is None:  # not in RAM: disk tier or storage (then cached), off the event loop
            raw = await self._loop.run_in_executor(self._pool, _read, layer, dataset, index)
        self.served += 1
        return web.Response(
            body=raw,
            headers={
                "ETag": etag_of(raw, None if versions is None else int(versions[0])),
                "Last-Modified": _LAST_MODIFIED,
            },
        )

    def stop(self) -> None:
        """Stop serving (tests); the thread ends with the loop."""
        if self._runner is not None and self._loop.is_running():
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._pool.shutdown(wait=False)


def _read(layer: Any, dataset: Any, index: int) -> bytes:
    return bytes(layer.fetch(dataset, [index])[0])
