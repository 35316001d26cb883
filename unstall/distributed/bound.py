"""`BoundPeers`: the cache layer's hook for one dataset: which misses this node owns (cached
here), the rest from the peers that own them (or storage when a peer fails)."""

from __future__ import annotations

from typing import Any

from unstall.cache.items import fetch_from_storage, versions_of
from unstall.distributed.client import PeerClient
from unstall.distributed.counters import SharedCounters
from unstall.distributed.placement import Placement


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
        *,
        certificates: dict[int, str | None],
    ):
        self.fingerprint, self.placement, self.addresses = fingerprint, placement, addresses
        self._token, self.timeout_s, self.skip_s = token, timeout_s, skip_s
        self.certificates = certificates  # node -> PEM; none: plain HTTP
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
                certificates=self.certificates,
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
        out["tls"] = any(c is not None for c in self.certificates.values())
        out.update(self.counters.read())
        return out

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self.counters.close()
