"""Peer traffic on the wire: ciphertext only, and a peer with another certificate is refused.

A relay between client and server (same 127.0.0.3, another port, so the
certificate's address still matches) records every byte each way, per
connection. A man in the middle terminates TLS with a certificate of its own
for the same address and forwards to the real server over TLS.
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import threading
import time

import pytest
import torch.distributed as dist

from tests.distributed.conftest import ItemsLayer, forked
from unstall.distributed import Peers, membership
from unstall.distributed.client import PeerClient
from unstall.distributed.peers import check_same_tls
from unstall.distributed.server import PeerServer
from unstall.distributed.tls import (
    NodeCertificate,
    PinnedCertificateError,
    client_context,
    make_certificate,
    server_context,
)

HOST, TOKEN = "127.0.0.3", "wire-test-token-5b8e"
MARKER = b"<<unstall-wire-marker>>"
ITEMS = [MARKER * (2000 + 100 * i) for i in range(4)]  # 46-53 KB each
CERT = make_certificate(HOST)


class Relay:
    """A TCP forwarder on ``HOST`` to ``target`` recording the bytes of each connection; with
    ``certificate`` it terminates TLS itself (records what it decrypts) and reaches the
    target over TLS trusting ``target_cert``."""

    def __init__(
        self,
        target: int,
        certificate: NodeCertificate | None = None,
        target_cert: str | None = None,
    ):
        self.target, self.target_cert = target, target_cert
        self.ctx = None if certificate is None else server_context(certificate)
        self.up: list[bytearray] = []  # client -> server, one per connection
        self.down: list[bytearray] = []
        self.refused = 0  # TLS handshakes the client broke off
        self.sock = socket.create_server((HOST, 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        if self.ctx is not None:
            try:
                conn = self.ctx.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):
                self.refused += 1
                conn.close()
                return
        upstream = socket.create_connection((HOST, self.target), timeout=10)
        if self.target_cert is not None:
            upstream = client_context(self.target_cert).wrap_socket(upstream, server_hostname=HOST)
        up, down = bytearray(), bytearray()
        self.up.append(up)
        self.down.append(down)
        _pump(conn, upstream, up, down)

    def close(self) -> None:
        self.sock.close()


def _pump(a: socket.socket, b: socket.socket, a_to_b: bytearray, b_to_a: bytearray) -> None:
    """Forward both ways in one thread until either side closes, recording each way.

    One thread per connection, not one per direction: an SSL socket is not safe to read in
    one thread while another writes it (OpenSSL's object is shared); with two threads per
    TLS-terminated connection, 8 of 40 runs here lost one GET of four.
    """
    route = {a: (b, a_to_b), b: (a, b_to_a)}
    try:
        while True:
            # TLS may hold decrypted bytes that select() cannot see
            ready = [s for s in route if isinstance(s, ssl.SSLSocket) and s.pending()]
            if not ready:
                ready, _, _ = select.select(list(route), [], [], 10)
                if not ready:
                    return
            for src in ready:
                data = src.recv(65536)
                if not data:
                    return
                dst, record = route[src]
                record += data
                dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (a, b):
            s.close()


@pytest.fixture(scope="module")
def servers():
    """A TLS server and a plain-HTTP one on ``HOST``, both serving ``ITEMS``."""
    out = {}
    for name, cert in (("tls", CERT), ("plain", None)):
        srv = PeerServer(HOST, TOKEN, certificate=cert)
        srv.start()
        srv.register("fp", ItemsLayer(ITEMS), ITEMS)
        out[name] = srv
    yield out
    for srv in out.values():
        srv.stop()


def _fetch(port: int, cert: str | None) -> tuple[list[bytes | None], float]:
    """In a forked child: GET every item from node 1 at ``HOST:port`` (pinned to ``cert``)."""

    def run():
        client = PeerClient(
            {0: "127.0.0.2:9", 1: f"{HOST}:{port}"},
            TOKEN,
            timeout_s=5.0,
            skip_s=0.0,
            fingerprint="fp",
            node=0,
            generation=lambda: 0,
            certificates={1: cert},
        )
        t0 = time.monotonic()
        got = client.get_many([(1, i) for i in range(len(ITEMS))])
        return got, time.monotonic() - t0

    return forked(run)


def _in_clear(records: list[bytearray], needle: bytes) -> bool:
    return any(needle in r for r in records)


def test_tls_traffic_on_the_wire_is_ciphertext(servers):
    relay = Relay(servers["tls"].port)
    try:
        got, _ = _fetch(relay.port, CERT.cert_pem)
    finally:
        relay.close()
    assert got == ITEMS  # through the relay, every byte
    assert relay.up and sum(len(r) for r in relay.down) > sum(map(len, ITEMS))
    assert all(r[:3] == b"\x16\x03\x01" for r in relay.up)  # each opens with a TLS ClientHello
    for needle in (MARKER, MARKER[:12], TOKEN.encode(), b"Bearer", b"GET /v1", b"HTTP/1.1"):
        assert not _in_clear(relay.up + relay.down, needle), needle


def test_plain_http_opt_out_is_readable_on_the_wire(servers):
    """The control: the same relay reads the token and the data of a plain-HTTP peer."""
    relay = Relay(servers["plain"].port)
    try:
        got, _ = _fetch(relay.port, None)
    finally:
        relay.close()
    assert got == ITEMS
    assert _in_clear(relay.up, f"Bearer {TOKEN}".encode())
    assert _in_clear(relay.up, b"GET /v1/fp/0 HTTP/1.1")
    assert _in_clear(relay.down, ITEMS[3])


def test_a_peer_whose_certificate_is_not_the_published_one_is_refused(servers):
    """The client pins the certificate published for node 1 (checked against its fingerprint);
    a man in the middle presenting another certificate for the same address is refused in
    the handshake: it never sees the token nor a request, and the item is not served."""
    store = dist.HashStore()
    membership.publish(store, 0, "127.0.0.2:9", make_certificate("127.0.0.2").cert_pem)
    membership.publish(store, 1, f"{HOST}:{servers['tls'].port}", CERT.cert_pem)
    _, certificates = membership.members(store, 2)
    assert certificates[1] == CERT.cert_pem
    intruder = make_certificate(HOST)  # same address, another key
    mitm = Relay(servers["tls"].port, certificate=intruder, target_cert=CERT.cert_pem)
    served = servers["tls"].served
    try:
        got, took = _fetch(mitm.port, certificates[1])
        assert got == [None] * len(ITEMS) and took < 3.0  # refused at once, not timed out (5 s)
        deadline = time.monotonic() + 5
        while mitm.refused == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the relay's thread sees the client's alert
        assert mitm.refused >= 1 and mitm.up == []  # nothing decrypted: no token, no request
        assert servers["tls"].served == served
        # the control: a client that trusted the intruder's certificate is read in clear
        got, _ = _fetch(mitm.port, intruder.cert_pem)
        assert got == ITEMS
        assert _in_clear(mitm.up, f"Bearer {TOKEN}".encode())
        assert _in_clear(mitm.down, ITEMS[0])
    finally:
        mitm.close()


def test_a_certificate_for_another_address_is_refused():
    """The pinned certificate itself, presented at an address it does not name: refused."""
    elsewhere = make_certificate("127.0.0.4")
    srv = PeerServer(HOST, TOKEN, certificate=elsewhere)
    srv.start()
    srv.register("fp", ItemsLayer(ITEMS), ITEMS)
    try:
        assert _fetch(srv.port, elsewhere.cert_pem)[0] == [None] * len(ITEMS)
        assert srv.served == 0
    finally:
        srv.stop()


def test_a_tls_server_gives_no_plain_http_answer(servers):
    served = servers["tls"].served
    request = f"GET /v1/fp/0 HTTP/1.1\r\nHost: {HOST}\r\nAuthorization: Bearer {TOKEN}\r\n\r\n"
    answer = bytearray()
    with socket.create_connection((HOST, servers["tls"].port), timeout=5) as s:
        s.sendall(request.encode())
        try:
            while data := s.recv(65536):
                answer += data
        except OSError:
            pass
    assert MARKER not in answer and b"HTTP/" not in answer
    assert servers["tls"].served == served


def test_published_fingerprint_must_match_the_certificate():
    store = dist.HashStore()
    other = make_certificate(HOST)
    membership.publish(store, 0, f"{HOST}:1", None)  # a plain-HTTP node
    membership.publish(store, 1, f"{HOST}:2", CERT.cert_pem)
    addresses, certificates = membership.members(store, 2)
    assert addresses == {0: f"{HOST}:1", 1: f"{HOST}:2"}
    assert certificates == {0: None, 1: CERT.cert_pem}
    entry = {"address": f"{HOST}:2", "certificate": other.cert_pem, "sha256": CERT.sha256}
    store.set("node/1", json.dumps(entry))  # another certificate under node 1's fingerprint
    with pytest.raises(PinnedCertificateError, match="node 1's published certificate"):
        membership.members(store, 2)


def test_every_node_must_agree_on_tls():
    with pytest.raises(RuntimeError, match=r"node 1 serves plain HTTP .* Peers\(tls=True\)"):
        check_same_tls(True, 0, {0: CERT.cert_pem, 1: None})
    with pytest.raises(RuntimeError, match=r"node 0 serves TLS .* Peers\(tls=False\)"):
        check_same_tls(False, 1, {0: CERT.cert_pem, 1: None})
    check_same_tls(True, 0, {0: CERT.cert_pem, 1: CERT.cert_pem})
    with pytest.raises(ValueError, match=r"certificates= for nodes \[1\]"):
        Peers(node=0, addresses={0: f"{HOST}:1", 1: f"{HOST}:2"}, token=TOKEN)
    Peers(node=0, addresses={0: f"{HOST}:1", 1: f"{HOST}:2"}, token=TOKEN, tls=False)
