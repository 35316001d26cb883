"""A delaying, fault-injecting TCP proxy for HTTP/1.1 object-store traffic (tests, benchmarks).

`DelayProxy` listens on 127.0.0.1 and forwards to an upstream server. It reads
each request's head to find where requests start on a keep-alive connection,
so the added ``delay`` is per *request*, not per connection: each request is
held ``delay`` seconds before it goes upstream. Responses pass through untouched.

Faults, for a fraction ``fail_rate`` of requests, chosen by a hash of (seed,
request line, how often that request line was seen), so runs are repeatable and
a retry of a failed request is judged afresh: ``"503"`` answers ``503 Slow Down``
itself; ``"reset"`` drops the connection without an answer; ``"truncate"``
forwards the request and cuts the response after a few hundred bytes.

Bodies with ``Transfer-Encoding: chunked`` switch that connection to plain
pass-through (no more delays or faults on it).

``ignore_range=True`` plays a server without range support: a ``206`` answer
goes out as ``200`` without ``Content-Range`` (the request's ``Range`` header is
signed, so it cannot be stripped). That is exact for ranges that cover the
whole object, as unstall's whole-object GETs do.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import os
import socket
import struct
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FAULTS = ("503", "reset", "truncate")
_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_RESPONSE_503 = (
    b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_SLOW_DOWN), _SLOW_DOWN)
)
TRUNCATE_AFTER = 400  # bytes of the response that get through before a "truncate" cut


@dataclass
class ProxyStats:
    """What the proxy saw; ``agents`` maps connection id -> User-Agent values on it."""

    connections: int = 0
    requests: int = 0
    faults: collections.Counter = field(default_factory=collections.Counter)
    request_lines: collections.Counter = field(default_factory=collections.Counter)
    agents: dict[int, set[str]] = field(default_factory=dict)


class DelayProxy:
    """Forward 127.0.0.1:<port> to ``upstream``, adding ``delay`` seconds per request.

    Runs an asyncio loop in a daemon thread; `start`/`stop` (idempotent) or use it
    as a context manager.

    Args:
        upstream: ``(host, port)`` or an ``http://host:port`` URL.
        delay: seconds added to every request [Unit: second].
        fail_rate: fraction of requests that get a fault, in [0, 1].
        faults: which faults to draw from (see module doc).
        seed: makes the choice of faulty requests repeatable.
        record: keep per-request-line counts and per-connection User-Agents.
        ignore_range: answer range requests as a server that ignores ``Range`` (module doc).
        truncate_after: bytes of a response (head included) that pass before a
            ``"truncate"`` cut: past the head, a body arrives in part.
    """

    def __init__(
        self,
        upstream: tuple[str, int] | str,
        *,
        delay: float = 0.0,
        fail_rate: float = 0.0,
        faults: Sequence[str] = ("503", "reset"),
        seed: int = 0,
        record: bool = True,
        ignore_range: bool = False,
        truncate_after: int = TRUNCATE_AFTER,
    ):
        if isinstance(upstream, str):
            hostport = upstream.split("://", 1)[-1].split("/", 1)[0]
            host, _, port = hostport.rpartition(":")
            upstream = (host, int(port))
        if delay < 0:
            raise ValueError(f"delay={delay} must be >= 0 seconds")
        if not 0 <= fail_rate <= 1:
            raise ValueError(f"fail_rate={fail_rate} must be in [0, 1]")
        unknown = set(faults) - set(FAULTS)
        if unknown or not faults:
            raise ValueError(f"faults={list(faults)} must be a non-empty subset of {FAULTS}")
        self.upstream = upstream
        self.delay = delay
        self.fail_rate = fail_rate
        self.faults = tuple(faults)
        self.seed = seed
        self.record = record
        self.ignore_range = ignore_range
        self.truncate_after = truncate_after
        self.stats = ProxyStats()
        self.port = 0
        self._seen: collections.Counter = collections.Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server_thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._finalizer: weakref.finalize | None = None
        self._clients: weakref.WeakSet[_Client] = weakref.WeakSet()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> DelayProxy:
        if self._server_thread is not None:
            return self
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            self._server = loop.run_until_complete(
                loop.create_server(lambda: _Client(self), "127.0.0.1", 0, backlog=1024)
            )
            self.port = self._server.sockets[0].getsockname()[1]
            ready.set()
            loop.run_forever()
            self._server.close()
            clients = list(self._clients)
            for client in clients:  # open keep-alive connections end now
                client.abort()
            loop.run_until_complete(asyncio.sleep(0))
            # a connection to the upstream still being made is cancelled while the loop runs:
            # left pending, its task was finalized after `loop.close()`, closing its transport
            # on a closed loop (an unraisable RuntimeError in whatever ran the collector)
            connecting = [c._connecting for c in clients if not c._connecting.done()]
            for task in connecting:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*connecting, return_exceptions=True))
            loop.close()

        self._loop = loop
        self._server_thread = threading.Thread(target=run, name="unstall-delay-proxy", daemon=True)
        self._server_thread.start()
        if not ready.wait(10):
            raise RuntimeError("DelayProxy did not start within 10 s")
        self._finalizer = weakref.finalize(self, _stop_loop, loop, self._server_thread, os.getpid())
        return self

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._server_thread = None

    def reset_stats(self) -> None:
        self.stats = ProxyStats()

    def __enter__(self) -> DelayProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def choose_fault(self, request_line: bytes) -> str | None:
        """The fault for this request, or None; a pure function of seed, line and repeat."""
        if self.fail_rate <= 0:
            return None
        n = self._seen[request_line]
        self._seen[request_line] = n + 1
        digest = hashlib.blake2b(
            request_line + struct.pack("<qq", self.seed, n), digest_size=8
        ).digest()
        u, which = struct.unpack("<II", digest)
        if u / 2**32 >= self.fail_rate:
            return None
        return self.faults[which % len(self.faults)]


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread, owner: int) -> None:
    if os.getpid() != owner or not thread.is_alive():
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


def _as_full_response(data: bytes) -> bytes:
    """A ``206`` response head (at the start of ``data``) rewritten as ``200`` without its range."""
    end = data.find(b"\r\n\r\n")
    _, _, headers = data[:end].partition(b"\r\n")
    kept = [h for h in headers.split(b"\r\n") if not h.lower().startswith(b"content-range:")]
    return b"\r\n".join([b"HTTP/1.1 200 OK", *kept]) + data[end:]


class _Upstream(asyncio.Protocol):
    def __init__(self, client: _Client):
        self.client = client
        self.cut_after: int | None = None  # set for a "truncate" fault

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.cut_after is not None:
            self.client.transport.write(data[: self.cut_after])
            self.client.abort()
            return
        if self.client.proxy.ignore_range and data.startswith(b"HTTP/1.1 206"):
            data = _as_full_response(data)
        self.client.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()

    def pause_writing(self) -> None:
        self.client.transport.pause_reading()

    def resume_writing(self) -> None:
        self.client.transport.resume_reading()


class _Client(asyncio.Protocol):
    """One client connection: parses request heads, holds each request ``delay`` seconds."""

    def __init__(self, proxy: DelayProxy):
        self.proxy = proxy
        self.buf = bytearray()
        self.body_left = 0  # bytes of the current request's body still to come
        self.passthrough = False
        self.drop_body = False  # discarding the body of a request we answered ourselves
        self.held: list[bytes] | None = None  # bytes waiting for the delay to pass
        self.upstream: _Upstream | None = None
        self.closed = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.id = id(self)
        self.proxy._clients.add(self)
        self.proxy.stats.connections += 1
        transport.pause_reading()
        loop = asyncio.get_running_loop()
        self._connecting = loop.create_task(self._connect(loop))

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            _, self.upstream = await loop.create_connection(
                lambda: _Upstream(self), *self.proxy.upstream
            )
        except OSError:
            self.abort()
            return
        self.upstream.transport.set_write_buffer_limits(high=1 << 20)
        self.transport.set_write_buffer_limits(high=1 << 20)
        self.transport.resume_reading()

    def data_received(self, data: bytes) -> None:
        if self.passthrough:
            self._send(data)
            return
        self.buf += data
        while self.buf and not self.closed:
            if self.body_left:
                chunk = bytes(self.buf[: self.body_left])
                del self.buf[: self.body_left]
                self.body_left -= len(chunk)
                if not self.drop_body:
                    self._send(chunk)
                continue
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[: end + 4])
            del self.buf[: end + 4]
            self._request(head)

    def _request(self, head: bytes) -> None:
        proxy = self.proxy
        proxy.stats.requests += 1
        line, _, rest = head.partition(b"\r\n")
        length = 0
        chunked = False
        agent = ""
        for header in rest.split(b"\r\n"):
            name, _, value = header.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value.strip() or 0)
            elif name == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
            elif name == b"user-agent":
                agent = value.strip().decode("latin-1")
        if proxy.record:
            proxy.stats.request_lines[line.decode("latin-1")] += 1
            proxy.stats.agents.setdefault(self.id, set()).add(agent)
        fault = proxy.choose_fault(line)
        self.body_left = length
        self.drop_body = fault in ("503", "reset")
        if fault:
            proxy.stats.faults[fault] += 1
        if chunked:
            self.passthrough = True
        self._hold(head if not self.drop_body else b"", fault)
        if self.passthrough and self.buf:
            self._send(bytes(self.buf))
            self.buf.clear()

    def _hold(self, head: bytes, fault: str | None) -> None:
        loop = asyncio.get_running_loop()
        self.held = [head] if head else []
        if fault == "truncate" and self.upstream is not None:
            self.upstream.cut_after = self.proxy.truncate_after
        loop.call_later(self.proxy.delay, self._release, fault)

    def _release(self, fault: str | None) -> None:
        held, self.held = self.held or [], None
        if self.closed:
            return
        if fault == "503":
            self.transport.write(_RESPONSE_503)
        elif fault == "reset":
            self.abort()
        else:
            for chunk in held:
                self._send(chunk)

    def _send(self, data: bytes) -> None:
        if self.held is not None:
            self.held.append(data)
        elif self.upstream is not None and data:
            self.upstream.transport.write(data)

    def abort(self) -> None:
        if self.closed:
            return
        self.closed = True
        sock = self.transport.get_extra_info("socket")
        if sock is not None:  # RST, not FIN: a real "connection reset by peer"
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()
        if self.upstream is not None:
            self.upstream.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.upstream is not None:
            self.upstream.transport.close()

    def pause_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.upstream is not None:
            self.upstream.transport.resume_reading()
