"""``stats()["remote"]``: what the remote workers did, per node.

Per node: batches prepared there and handed to the loop, the workers' seconds preparing
them (fetch included), the training process's seconds taking them out of Ray (the get
and the copy into its own memory), the bytes moved, and the batches lost with a worker
there. Totals: batches by where they were prepared, batches re-sent after a loss, and
batches prepared in the training process after no remote worker was left.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass
class NodeStats:
    """One node's counters."""

    batches: int = 0  #: batches prepared there and handed out
    prep_s: float = 0.0  #: workers' seconds fetching and preparing them [s]
    transfer_s: float = 0.0  #: the training process's seconds getting and copying them [s]
    bytes: int = 0  #: tensor bytes moved from there [B]
    failures: int = 0  #: batches lost with a worker there (re-sent elsewhere)


class RemoteStats:
    """The counters of one loader's remote workers, across its epochs."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeStats] = {}
        self.local_batches = 0  # prepared by local workers (or the main process)
        self.resent = 0  # batches sent again after their worker was lost
        self.fallback_batches = 0  # prepared here after no remote worker was left
        self.batch_bytes = 0  # the largest remote batch seen [B] (sizes the bytes cap)

    def node(self, name: str) -> NodeStats:
        if name not in self.nodes:
            self.nodes[name] = NodeStats()
        return self.nodes[name]

    def received(self, node: str, nbytes: int, prep_s: float, transfer_s: float) -> None:
        """One remote batch handed out."""
        s = self.node(node)
        s.batches += 1
        s.prep_s += prep_s
        s.transfer_s += transfer_s
        s.bytes += nbytes
        self.batch_bytes = max(self.batch_bytes, nbytes)

    def as_dict(self, workers: int, up: int, address: str) -> dict[str, Any]:
        remote = sum(s.batches for s in self.nodes.values())
        return {
            "remote": {
                "address": address,
                "workers": workers,
                "workers_up": up,
                "batches": remote,
                "local_batches": self.local_batches,
                "resent": self.resent,
                "fallback_batches": self.fallback_batches,
                "bytes": sum(s.bytes for s in self.nodes.values()),
                "nodes": {name: _rounded(asdict(s)) for name, s in sorted(self.nodes.items())},
            }
        }


def _rounded(counters: dict[str, Any]) -> dict[str, Any]:
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in counters.items()}
