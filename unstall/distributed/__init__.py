"""A partitioned cache across nodes: each item has one owner node, peers serve local misses.

``unstall.Cache(capacity, peers=unstall.Peers())`` under torchrun: every node
caches only the items it owns (rendezvous hashing of the key), so the nodes'
caches together hold D x C; a miss on an item another node owns is an HTTP GET
to that node's peer server (authenticated with the job token), and a peer that
fails costs one short timeout, after which its items come from storage.
"""

from __future__ import annotations

import os
from typing import Any

from unstall.cache.layer import fetch_from_storage, versions_of
from unstall.distributed import membership
from unstall.distributed.client import PeerClient
from unstall.distributed.counters import SharedCounters
from unstall.distributed.placement import Placement, owner_of
from unstall.distributed.server import PeerServer

_SERVER: PeerServer | None = None  # this process's peer server (local rank 0 only)


class Peers:
    """How a `Cache` finds the other nodes: torchrun's environment, or explicit addresses.

    Args:
        timeout_s: per-request limit toward a peer [Unit: second]; no retries.
        skip_s: how long a peer that failed is skipped [Unit: second]; None (the
            default): until the loader's next epoch, where it rejoins.
        store_timeout_s: how long to wait for every node to publish its address.
        node, addresses, token: explicit membership instead of torch.distributed
            (``addresses``: node id -> ``host:port``); no server is started then
            unless ``serve=True`` (it binds ``addresses[node]``).
    """

    def __init__(
        self,
        *,
        timeout_s: float = 2.0,
        skip_s: float | None = None,
        store_timeout_s: float = 300.0,
        node: int | None = None,
        addresses: dict[int, str] | None = None,
        token: str | None = None,
        serve: bool = False,
    ):
        if not timeout_s > 0 or (skip_s is not None and skip_s < 0):
            raise ValueError(f"timeout_s={timeout_s!r} must be > 0 and skip_s={skip_s!r} >= 0")
        if addresses is not None and (node is None or not token or node not in addresses):
            raise ValueError("explicit addresses need node (one of their keys) and token")
        self.timeout_s, self.skip_s, self.store_timeout_s = timeout_s, skip_s, store_timeout_s
        self.node, self.addresses, self.token, self.serve = node, addresses, token, serve
        self._store: Any = None

    def __repr__(self) -> str:
        return f"Peers(node={self.node}, addresses={self.addresses})"

    def attach(self, layer: Any, dataset: Any) -> BoundPeers:
        """Join the job for ``dataset`` (called by `Cache.bind`): serve, publish, look up."""
        fingerprint = str(dataset.fingerprint())
        if self.addresses is not None:
            node, addresses, token = self.node, dict(self.addresses), str(self.token)
            if self.serve:
                host, _, port = addresses[node].rpartition(":")
                _serve(host, token, int(port)).register(fingerprint, layer, dataset)
        else:
            env = membership.node_env()
            if self._store is None:
                self._store = membership.job_store(env, self.store_timeout_s)
            token = membership.job_token(self._store, env)
            node = env.node
            if env.local_rank == 0:
                first = _SERVER is None
                host = membership.reach_address(env.master_addr)
                port = int(os.environ.get("UNSTALL_PEER_PORT", "0"))
                server = _serve(host, token, port)
                server.register(fingerprint, layer, dataset)
                if first:
                    membership.publish(self._store, node, f"{server.host}:{server.port}")
            addresses = membership.addresses(self._store, env.nodes)
        assert node is not None
        placement = Placement(node, len(addresses))
        return BoundPeers(fingerprint, placement, addresses, token, self.timeout_s, self.skip_s)


def _serve(host: str, token: str, port: int) -> PeerServer:
    global _SERVER
    if _SERVER is None:
        server = PeerServer(host, token, port)
        server.start()
        _SERVER = server
    return _SERVER


class BoundPeers:
    """The cache layer's hook for one dataset: which misses are ours, the rest from peers."""

    def __init__(
        self,
        fingerprint: str,
        placement: Placement,
        addresses: dict[int, str],
        token: str,
        timeout_s: float,
        skip_s: float | None,
    ):
        self.fingerprint, self.placement, self.addresses = fingerprint, placement, addresses
        self._token, self.timeout_s, self.skip_s = token, timeout_s, skip_s
        self.counters = SharedCounters()
        self._client: PeerClient | None = None
        self._peer_client()  # here, before workers fork: they inherit its stores (see client)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_client=None)  # a spawned worker builds its own
        return state

    def _peer_client(self) -> PeerClient:
        if self._client is None:
            self._client = PeerClient(
                self.addresses,
                self._token,
                self.timeout_s,
                self.skip_s,
                fingerprint=self.fingerprint,
                node=self.placement.node,
                generation=self.counters.generation,
            )
        return self._client

    def ours(self, dataset: Any, index: int) -> bool:
        """True if this node owns ``index`` (it caches it and serves it to the others)."""
        return self.placement.owner(dataset, index) == self.placement.node

    def fetch_missing(self, dataset: Any, indices: list[int]) -> tuple[list[bytes], list[bool]]:
        """Bytes of local misses (peers' items from them, the rest from storage), and which
        are ours (to be cached here)."""
        node = self.placement.node
        owners = [self.placement.owner(dataset, i) for i in indices]
        remote = [(o, i) for o, i in zip(owners, indices, strict=True) if o != node]
        versions = versions_of(dataset, [i for _, i in remote]) if remote else None
        expect = versions.tolist() if versions is not None else None
        got = self._peer_client().get_many(remote, expect) if remote else []
        raws: list[bytes | None] = [None] * len(indices)
        served = iter(got)
        for j, o in enumerate(owners):
            if o != node:
                raws[j] = next(served)
        need = [j for j, raw in enumerate(raws) if raw is None]
        if need:
            fetched = fetch_from_storage(dataset, [indices[j] for j in need])
            for j, raw in zip(need, fetched, strict=True):
                raws[j] = raw
        hits = [r for r in got if r is not None]
        self.counters.add(
            peer_hits=len(hits),
            peer_bytes=sum(len(r) for r in hits),
            peer_errors=len(got) - len(hits),
            storage_reads=len(need),
            storage_bytes=sum(len(raws[j]) for j in need),  # type: ignore[arg-type]
        )
        return raws, [o == node for o in owners]  # type: ignore[return-value]

    def begin_epoch(self) -> None:
        """A new epoch of the loader (main process): failed peers are tried again."""
        self.counters.next_generation()

    def stats(self) -> dict[str, Any]:
        """Cumulative peer traffic of this loader's processes, plus this node's place."""
        out: dict[str, Any] = {"node": self.placement.node, "nodes": self.placement.nodes}
        out.update(self.counters.read())
        return out

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self.counters.close()


__all__ = ["BoundPeers", "Peers", "owner_of"]
