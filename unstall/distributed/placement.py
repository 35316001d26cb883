"""Which node owns an item: rendezvous hashing of the item's key over the node ids.

Every node computes the same owner from the key alone (no metadata service), and
a node's items stay with it when the node count changes for other nodes' items
(only the items of a node that leaves or joins move).
"""

from __future__ import annotations

import hashlib


def owner_of(key: str, nodes: int) -> int:
    """The node in ``range(nodes)`` that owns ``key`` (highest hash of node id and key)."""
    if nodes <= 1:
        return 0
    best, who = -1, 0
    data = key.encode()
    for node in range(nodes):
        digest = hashlib.blake2b(data, digest_size=8, person=node.to_bytes(8, "little")).digest()
        score = int.from_bytes(digest, "little")
        if score > best:
            best, who = score, node
    return who


class Placement:
    """Owners of a dataset's indices for one node, memoised per index."""

    def __init__(self, node: int, nodes: int):
        if not 0 <= node < nodes:
            raise ValueError(f"node={node} must be in [0, {nodes})")
        self.node, self.nodes = node, nodes
        self._owners: dict[int, int] = {}

    def owner(self, dataset: object, index: int) -> int:
        who = self._owners.get(index)
        if who is None:
            who = owner_of(dataset.key(index), self.nodes)  # type: ignore[attr-defined]
            self._owners[index] = who
        return who
