"""`Peers`: how a partitioned `Cache` finds the job's other nodes, and this process's server.

`Peers.attach` (called by `Cache.bind`) starts this process's peer server (local
rank 0 only), publishes its address and certificate in the job's store, reads the
other nodes', and returns the `unstall.distributed.bound.BoundPeers` the cache layer
asks for its misses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from unstall import machine
from unstall.distributed import membership
from unstall.distributed.bound import BoundPeers
from unstall.distributed.placement import Placement
from unstall.distributed.server import PeerServer
from unstall.distributed.tls import NodeCertificate, make_certificate

_SERVER: PeerServer | None = None  # this process's peer server (local rank 0 only)


def running_server() -> PeerServer | None:
    """This process's peer server, if it started one (tests and benches)."""
    return _SERVER


class Peers:
    """How a `Cache` finds the other nodes: torchrun's environment, or explicit addresses.

    Args:
        timeout_s: per-request limit toward a peer, connecting and the TLS handshake
            included [Unit: second]; no retries.
        skip_s: how long a peer that failed is skipped [Unit: second]; None (the
            default): until the loader's next epoch, where it rejoins.
        store_timeout_s: how long to wait for every node to publish its address.
        tls: encrypt peer traffic (the default): each node's server makes a self-signed
            certificate at start and publishes it with its fingerprint; the others trust
            exactly that certificate. ``False``: plain HTTP (every node must agree).
        node, addresses, token: explicit membership instead of torch.distributed
            (``addresses``: node id -> ``host:port``); no server is started then
            unless ``serve=True`` (it binds ``addresses[node]``).
        certificates, server_certificate: with explicit addresses and TLS, each other
            node's certificate (PEM, node id -> PEM) and, with ``serve=True``, this
            node's own (`unstall.distributed.tls.make_certificate`).
    """

    def __init__(
        self,
        *,
        timeout_s: float = 2.0,
        skip_s: float | None = None,
        store_timeout_s: float = 300.0,
        tls: bool = True,
        node: int | None = None,
        addresses: dict[int, str] | None = None,
        token: str | None = None,
        serve: bool = False,
        certificates: dict[int, str] | None = None,
        server_certificate: NodeCertificate | None = None,
    ):
        if not timeout_s > 0 or (skip_s is not None and skip_s < 0):
            raise ValueError(f"timeout_s={timeout_s!r} must be > 0 and skip_s={skip_s!r} >= 0")
        if addresses is not None and (node is None or not token or node not in addresses):
            raise ValueError("explicit addresses need node (one of their keys) and token")
        if addresses is not None and tls:
            missing = sorted(set(addresses) - {node} - set(certificates or {}))
            if missing or (serve and server_certificate is None):
                raise ValueError(
                    f"explicit addresses with tls=True need certificates= for nodes {missing} "
                    "(PEM) and, with serve=True, server_certificate= (see "
                    "unstall.distributed.tls.make_certificate); or tls=False for plain HTTP"
                )
        if not tls and (certificates or server_certificate):
            raise ValueError("certificates= and server_certificate= need tls=True")
        self.timeout_s, self.skip_s, self.store_timeout_s = timeout_s, skip_s, store_timeout_s
        self.tls = tls
        self.node, self.addresses, self.token, self.serve = node, addresses, token, serve
        self.certificates, self.server_certificate = certificates, server_certificate
        self._store: Any = None

    def __repr__(self) -> str:
        return f"Peers(node={self.node}, addresses={self.addresses})"

    def attach(self, layer: Any, dataset: Any) -> BoundPeers:
        """Join the job for ``dataset`` (called by `Cache.bind`): serve, publish, look up."""
        fingerprint = str(dataset.fingerprint())
        certificates: dict[int, str | None]
        if self.addresses is not None:
            node, addresses, token = self.node, dict(self.addresses), str(self.token)
            certificates = {n: (self.certificates or {}).get(n) for n in addresses}
            if self.serve:
                host, _, port = addresses[node].rpartition(":")
                own = self.server_certificate
                server = _serve(host, token, int(port), self.tls, lambda: own)
                server.register(fingerprint, layer, dataset)
        else:
            env = membership.node_env()
            if self._store is None:
                self._store = membership.job_store(env, self.store_timeout_s)
            token = membership.job_token(self._store, env)
            node = env.node
            if env.local_rank == 0:
                first = _SERVER is None
                host = membership.reach_address(env.master_addr)
                port = machine.peer_port()
                server = _serve(host, token, port, self.tls, lambda: make_certificate(host))
                server.register(fingerprint, layer, dataset)
                if first:
                    cert = server.certificate
                    address = f"{server.host}:{server.port}"
                    pem = None if cert is None else cert.cert_pem
                    membership.publish(self._store, node, address, pem)
            addresses, certificates = membership.members(self._store, env.nodes)
            check_same_tls(self.tls, node, certificates)
        assert node is not None
        placement = Placement(node, len(addresses))
        return BoundPeers(
            fingerprint,
            placement,
            addresses,
            token,
            self.timeout_s,
            self.skip_s,
            certificates=certificates if self.tls else {},
        )


def _serve(
    host: str, token: str, port: int, tls: bool, certificate: Callable[[], NodeCertificate | None]
) -> PeerServer:
    """This process's peer server, started on first use (with a certificate if ``tls``)."""
    global _SERVER
    if _SERVER is None:
        server = PeerServer(host, token, port, certificate() if tls else None)
        server.start()
        _SERVER = server
    elif (_SERVER.certificate is not None) != tls:
        raise RuntimeError(
            f"this process's peer server already runs with tls={not tls}: every Peers() of a "
            f"process must use the same tls= (got tls={tls})"
        )
    return _SERVER


def check_same_tls(tls: bool, node: int, certificates: dict[int, str | None]) -> None:
    """Every node must agree on TLS: no silent fall back to plain HTTP, nor the reverse."""
    for n, cert in certificates.items():
        if n != node and (cert is not None) != tls:
            theirs = "serves plain HTTP (tls=False)" if cert is None else "serves TLS (tls=True)"
            raise RuntimeError(
                f"node {n} {theirs} but this node {node} has Peers(tls={tls}): set the same "
                "tls= on every node"
            )
