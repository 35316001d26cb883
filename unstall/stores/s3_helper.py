"""Run the creating process's S3 requests in a forked helper, so workers can fork safely.

obstore's tokio runtime hangs in a forked child once the parent has used it
(measured with obstore 0.12: a child's first request never completes). The
process that builds an `S3Store` (the training script, which later forks
DataLoader workers) therefore never makes a request itself: listing, uploads
and any fetch there go to a helper process forked *before* any obstore use.
Forked workers start clean and build their own client in-process.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import threading
import weakref
from multiprocessing.connection import Connection
from typing import Any

from unstall.errors import StoreError
from unstall.stores.s3_config import S3Settings
from unstall.stores.s3_stats import SharedStats


class Helper:
    """A forked process holding one `Fetcher`; calls are forwarded over a pipe, one at a time."""

    def __init__(self, settings: S3Settings, stats: SharedStats):
        self.settings = settings
        self.pid = os.getpid()
        # imported here, not first in the child: a fork while another thread of this process
        # is importing leaves that import's lock broken in the child, whose own import then
        # fails (``KeyError`` in importlib's module lock); importing obstore starts no runtime
        import obstore.store  # noqa: F401

        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve, args=(settings, stats, child, self._conn), daemon=True,
            name="unstall-s3-helper",
        )  # fmt: skip
        self._proc.start()
        child.close()
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _shutdown, self._conn, self._proc, self.pid)

    def call(self, op: str, *args: Any, bound_s: float | None) -> Any:
        """Run ``Fetcher.<op>(*args)`` in the helper; its exception re-raises here.
        ``bound_s=None``: no bound (an op that bounds its own progress, e.g. downloads)."""
        with self._lock:
            if not self._proc.is_alive():
                raise StoreError(
                    f"S3 helper process {self._proc.pid} for {self.settings.url} died "
                    f"(exit code {self._proc.exitcode}); recreate the store",
                    store=self.settings.url,
                )
            self._conn.send((op, args))
            if not self._conn.poll(bound_s):
                self._proc.kill()
                raise StoreError(
                    f"S3 helper process {self._proc.pid} did not answer {op} on "
                    f"{self.settings.url} within {bound_s or 0:.0f} s; killed it",
                    store=self.settings.url,
                )
            try:
                ok, value = self._conn.recv()
            except EOFError:
                raise StoreError(
                    f"S3 helper process {self._proc.pid} for {self.settings.url} exited "
                    f"during {op} (exit code {self._proc.exitcode})",
                    store=self.settings.url,
                ) from None
        if not ok:
            raise value
        return value

    def close(self) -> None:
        if self.pid == os.getpid():
            self._finalizer()


def _shutdown(conn: Connection, proc: multiprocessing.process.BaseProcess, pid: int) -> None:
    if os.getpid() != pid:  # a forked worker exiting: the helper is its parent's, not its own
        return
    with contextlib.suppress(OSError, ValueError):
        conn.send(("close", ()))
    proc.join(timeout=5)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5)
    conn.close()


def _serve(settings: S3Settings, stats: SharedStats, conn: Connection, parent: Connection) -> None:
    from unstall.stores.s3_client import Fetcher

    parent.close()
    fetcher = Fetcher(settings, stats)
    try:
        while True:
            try:
                op, args = conn.recv()
            except (EOFError, OSError):
                return
            if op == "close":
                return
            try:
                reply: tuple[bool, Any] = (True, getattr(fetcher, op)(*args))
            except Exception as exc:
                reply = (False, exc)
            try:
                conn.send(reply)
            except Exception as exc:  # an exception that does not pickle
                conn.send((False, StoreError(f"{type(exc).__name__}: {exc}")))
    finally:
        fetcher.close()
