"""Several "nodes" on one machine, as torchrun would start them: for tests and benchmarks.

Each node is a process tree of its own (a new session, so one signal reaches the
whole tree) with torchrun's environment for one rank per node, its own
shared-memory namespace (its own node-wide cache) and its own loopback address
127.0.0.(2 + rank), where its peer server binds.
"""

from __future__ import annotations

import os
import subprocess


def node_address(rank: int) -> str:
    return f"127.0.0.{2 + rank}"


def node_env(rank: int, world: int, port: int, namespace: str, **env: str) -> dict[str, str]:
    """This process's environment as node ``rank`` of ``world`` sees it: torchrun's variables
    (rank 0's address and ``port`` as the master), its own loopback address and shared-memory
    namespace, and ``env``."""
    return dict(
        os.environ,
        RANK=str(rank),
        LOCAL_RANK="0",
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE="1",
        GROUP_RANK=str(rank),
        MASTER_ADDR=node_address(0),
        MASTER_PORT=str(port),
        UNSTALL_PEER_ADDR=node_address(rank),
        UNSTALL_SHM_NAMESPACE=namespace,
        **env,
    )


def start_node(
    argv: list[str], rank: int, world: int, port: int, namespace: str, **env: str
) -> subprocess.Popen:
    """Start node ``rank`` of ``world`` running ``argv`` (stderr piped, text)."""
    full = node_env(rank, world, port, namespace, **env)
    return subprocess.Popen(
        argv, env=full, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
