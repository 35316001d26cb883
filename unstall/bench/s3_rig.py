"""The `bench s3` rig: the delay proxy in its own process, the no-loader GET ceiling, and
pinning storage and loader to separate cores (as if the server were another machine)."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

from unstall import machine
from unstall.testing import DelayProxy, SeaweedServer

BUCKET = "unstall-bench"
WORKERS, CEILING_INFLIGHT = 2, 128


def measure_ceiling(server: SeaweedServer, endpoint: str, keys: list[str]) -> float:
    """GETs/s through ``endpoint`` with many in flight and no loader.

    As many client processes as the loaders have workers (forked, own clients),
    ``CEILING_INFLIGHT`` requests in flight in all, all keys once.
    """
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    go = ctx.Event()
    opts = server.store_options(endpoint=endpoint)
    procs = [
        ctx.Process(target=_ceiling_child, args=(opts, keys[w::WORKERS], go, send))
        for w in range(WORKERS)
    ]
    for proc in procs:
        proc.start()
    send.close()
    go.set()
    spans = [recv.recv() for _ in procs if recv.poll(120)]
    for proc in procs:
        proc.join(timeout=10)
    if len(spans) < len(procs):
        return 0.0
    wall = max(end for _, end, _ in spans) - min(start for start, _, _ in spans)
    return sum(n for _, _, n in spans) / wall


def _ceiling_child(opts: dict[str, Any], keys: list[str], go: Any, send: Any) -> None:
    from unstall.stores.s3 import S3Store

    inflight = CEILING_INFLIGHT // WORKERS
    store = S3Store(f"s3://{BUCKET}/train", **opts, max_inflight=inflight, in_process=True)
    store.get_many(keys[:inflight])  # connections up
    go.wait(30)
    t0 = time.perf_counter()
    store.get_many(keys)
    send.send((t0, time.perf_counter(), len(keys)))
    store.close()


class ProxyProcess:
    """A `DelayProxy` in its own process, so its work never competes for the main GIL."""

    def __init__(self, upstream: str, delay: float):
        self.upstream, self.delay = upstream, delay

    def __enter__(self) -> str:
        ctx = multiprocessing.get_context("fork")
        recv, self._send = ctx.Pipe(duplex=False)
        self._stop = ctx.Event()
        self._proc = ctx.Process(
            target=_proxy_child, args=(self.upstream, self.delay, self._send, self._stop),
            daemon=True,
        )  # fmt: skip
        self._proc.start()
        if not recv.poll(15):
            raise RuntimeError("delay proxy process did not start within 15 s")
        return f"http://127.0.0.1:{recv.recv()}"

    @property
    def pid(self) -> int:
        return self._proc.pid

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=5)


def _proxy_child(upstream: str, delay: float, send: Any, stop: Any) -> None:
    with DelayProxy(upstream, delay=delay, record=False) as proxy:
        send.send(proxy.port)
        stop.wait()


def split_cpus() -> tuple[set[int], set[int]] | None:
    """Cores for (the loader, the storage side): storage gets the last, the loader the rest.

    None with fewer than 2 cores. On this 2-core machine that is one core each.
    """
    cpus = sorted(machine.cpu_set())
    return (set(cpus[:-1]), {cpus[-1]}) if len(cpus) >= 2 else None


@contextlib.contextmanager
def pinned(cpus_of: dict[int, set[int]]) -> Iterator[None]:
    """Every thread of each process ``pid`` runs on ``cpus_of[pid]`` inside the block.

    Threads and processes started meanwhile inherit their creator's cores (forked
    loader workers, new server threads); all threads get the old cores back after.
    """
    before = {pid: machine.cpu_set(pid) for pid in cpus_of}
    try:
        for pid, cpus in cpus_of.items():
            _set_all(pid, cpus)
        yield
    finally:
        for pid, cpus in before.items():
            _set_all(pid, cpus)


def _set_all(pid: int, cpus: set[int]) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):  # a thread that just ended
            os.sched_setaffinity(int(tid), cpus)
