"""A peer answering wrongly (a short body, or a connection cut mid-body, over TLS) costs
storage, not data."""

from __future__ import annotations

import asyncio
import gc
import hashlib
import os
import threading
from pathlib import Path

import unstall
from tests.distributed.conftest import make_data
from unstall.cache.shm import segment
from unstall.distributed import owner_of
from unstall.distributed.client import etag_of
from unstall.distributed.tls import make_certificate, server_context

N, TOKEN = 32, "tok"
CERT = make_certificate("127.0.0.3")


class LyingPeer:
    """Node 1's server, gone wrong: even items get half the body (its own length, the full
    item's ETag); odd items announce the full length and the connection is cut halfway."""

    def __init__(self, data: Path):
        self.data, self.requests = data, 0
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()
        threading.Thread(target=self._run, args=(ready,), daemon=True).start()
        assert ready.wait(10)

    def _run(self, ready: threading.Event) -> None:
        from aiohttp import web

        async def get(request):
            self.requests += 1
            index = int(request.match_info["index"])
            raw = (self.data / f"{index:05d}.bin").read_bytes()
            headers = {"ETag": etag_of(raw), "Last-Modified": "Thu, 01 Jan 2026 00:00:00 GMT"}
            if index % 2 == 0:
                return web.Response(body=raw[: len(raw) // 2], headers=headers)
            response = web.StreamResponse(headers=headers)
            response.content_length = len(raw)
            await response.prepare(request)
            await response.write(raw[: len(raw) // 2])
            request.transport.close()
            return response

        async def start():
            app = web.Application()
            app.router.add_get("/v1/{fp}/{index}", get)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.3", 0, ssl_context=server_context(CERT))
            await site.start()
            self.port = runner.addresses[0][1]

        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(start())
        ready.set()
        self.loop.run_forever()


def test_truncated_answers_are_refetched_from_storage(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSTALL_SHM_NAMESPACE", f"trunc{os.getpid()}")
    data = make_data(tmp_path / "data", N)
    peer = LyingPeer(data)
    peers = unstall.Peers(
        node=0,
        addresses={0: "127.0.0.2:9", 1: f"127.0.0.3:{peer.port}"},
        token=TOKEN,
        certificates={1: CERT.cert_pem},
        timeout_s=1.0,
        skip_s=0.0,  # ask again each time: every item of node 1 goes through the lie
    )
    ds = unstall.FileDataset(str(data), sorted(p.name for p in data.iterdir()))
    cache = unstall.Cache("1MiB", peers=peers)
    loader = unstall.DataLoader(ds, batch_size=4, num_workers=1, cache=cache)  # obstore in it
    got = [hashlib.sha256(raw).hexdigest() for b in loader for raw in b]
    want = [hashlib.sha256((data / k).read_bytes()).hexdigest() for k in ds.keys]
    assert got == want
    theirs = [i for i in range(N) if owner_of(ds.key(i), 2) == 1]
    stats = loader.stats()["peers"]
    assert len(theirs) >= 8 and peer.requests == len(theirs)
    assert stats["peer_hits"] == 0 and stats["peer_errors"] == len(theirs)
    assert stats["storage_reads"] == N
    assert loader.stats()["cache"]["inserted"] == N - len(theirs)  # ours only are cached
    cache.close()
    del loader, cache, peers
    gc.collect()
    prefix = segment.name_prefix()
    assert [n for n in os.listdir(segment.shm_dir()) if n.startswith(prefix)] == []
