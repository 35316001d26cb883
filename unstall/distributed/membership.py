"""Who is in the job, from torchrun's environment and torch.distributed's key-value store.

Each node's local rank 0 publishes its peer server's ``host:port``, with its TLS
certificate and the certificate's SHA-256 (none for plain HTTP); the job token
is made once by rank 0 (or read from ``$UNSTALL_PEER_TOKEN``) and shared the same
way. The store is the process group's when one is initialized, else a `TCPStore`
on ``MASTER_ADDR`` at ``$UNSTALL_PEER_STORE_PORT`` (default ``MASTER_PORT + 1``).
"""

from __future__ import annotations

import json
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from unstall import machine
from unstall.distributed import tls

#: Keys of this module in the job's store live under this prefix.
PREFIX = "unstall/peers/"


@dataclass(frozen=True)
class NodeEnv:
    """This process's place in the job, as torchrun describes it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int

    @property
    def node(self) -> int:
        return self.rank // self.local_world_size

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.local_world_size)


def node_env(environ: Any = None) -> NodeEnv:
    """Read torchrun's variables; a clear error names the one missing or wrong."""
    try:
        values = machine.torchrun_place(environ)
    except RuntimeError as exc:
        raise RuntimeError(f"unstall.Peers: {exc}") from None
    fields = {name.lower(): value for name, value in values.items()}  # NodeEnv's names
    try:
        ints = {k: int(v) for k, v in fields.items() if k != "master_addr"}
    except ValueError as exc:
        raise RuntimeError(f"torchrun variable is not an integer: {exc}") from None
    out = NodeEnv(**{**fields, **ints})
    if out.world_size % out.local_world_size:
        raise RuntimeError(
            f"WORLD_SIZE={out.world_size} is not a multiple of LOCAL_WORLD_SIZE="
            f"{out.local_world_size}: nodes must run the same number of ranks"
        )
    return out


def reach_address(master_addr: str) -> str:
    """``$UNSTALL_PEER_ADDR``, else the local address this node uses to reach MASTER_ADDR."""
    given = machine.peer_addr()
    if given:
        return given
    family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:  # no packet is sent: routing only
        s.connect((master_addr, 9))
        return s.getsockname()[0]


def job_store(env: NodeEnv, timeout_s: float) -> Any:
    """The job's key-value store (the process group's, else a TCPStore on MASTER_ADDR)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        base = dist.distributed_c10d._get_default_store()
    else:
        port = machine.peer_store_port(env.master_port + 1)
        base = dist.TCPStore(
            env.master_addr,
            port,
            world_size=env.world_size,
            is_master=env.rank == 0,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
    return dist.PrefixStore(PREFIX, base)  # holds a reference to a TCPStore we made


def job_token(store: Any, env: NodeEnv) -> str:
    """``$UNSTALL_PEER_TOKEN``, else a random token made by rank 0 and shared via the store."""
    token = machine.peer_token()
    if token:
        return token
    if env.rank == 0:
        store.set("token", secrets.token_urlsafe(32))
    return store.get("token").decode()


def publish(store: Any, node: int, address: str, cert_pem: str | None) -> None:
    """Publish this node's server: address, certificate and fingerprint in one key (atomic)."""
    sha256 = None if cert_pem is None else tls.fingerprint(cert_pem)
    entry = {"address": address, "certificate": cert_pem, "sha256": sha256}
    store.set(f"node/{node}", json.dumps(entry))


def members(store: Any, nodes: int) -> tuple[dict[int, str], dict[int, str | None]]:
    """Every node's ``host:port`` and certificate (None: plain HTTP), each certificate
    checked against its published fingerprint (waits, up to the store's timeout, for the
    late nodes)."""
    addresses: dict[int, str] = {}
    certificates: dict[int, str | None] = {}
    for k in range(nodes):
        entry = json.loads(store.get(f"node/{k}"))
        addresses[k] = entry["address"]
        cert = entry["certificate"]
        certificates[k] = None if cert is None else tls.check_pinned(k, cert, entry["sha256"])
    return addresses, certificates
