"""A partitioned cache across nodes: each item has one owner node, peers serve local misses.

``unstall.Cache(capacity, peers=unstall.Peers())`` under torchrun: every node
caches only the items it owns (rendezvous hashing of the key), so the nodes'
caches together hold D x C; a miss on an item another node owns is an HTTP GET
to that node's peer server (authenticated with the job token, over TLS with each
node's certificate pinned by the others: see `tls`), and a peer that fails costs
one short timeout, after which its items come from storage.
"""

from unstall.distributed.bound import BoundPeers
from unstall.distributed.client import PeerClient
from unstall.distributed.counters import SharedCounters
from unstall.distributed.peers import Peers
from unstall.distributed.placement import Placement, owner_of
from unstall.distributed.server import PeerServer
from unstall.distributed.tls import NodeCertificate, make_certificate

__all__ = [
    "BoundPeers",
    "NodeCertificate",
    "PeerClient",
    "PeerServer",
    "Peers",
    "Placement",
    "SharedCounters",
    "make_certificate",
    "owner_of",
]
