"""Joining the Ray cluster a `Remote` names: never starting one, and saying which.

``ray.init`` with no cluster to join would start a private one on this machine, whose
"remote" workers would take this node's own cores: unstall refuses that and asks for
an address. ``ray.init`` also installs its own SIGTERM handler (a training job's
launcher relies on its own, e.g. to checkpoint): the handlers in place are put back.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from unstall import machine
from unstall.remote.settings import Remote

log = logging.getLogger("unstall")


def import_ray() -> Any:
    """The ``ray`` module, or an error saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "Remote('ray') needs Ray: pip install 'unstall[ray]' (the same Ray version as "
            "the cluster's)"
        ) from exc
    return ray


def join(remote: Remote) -> str:
    """Join the cluster of ``remote`` (or the one this process joined already); its address.

    Raises:
        ValueError: no address given and ``$RAY_ADDRESS`` unset.
        ConnectionError: nothing answers at the address (Ray's own error, named).
    """
    ray = import_ray()
    if ray.is_initialized():
        address = _address(ray)
        log.warning("unstall: remote workers on the Ray cluster this process joined (%s)", address)
        return address
    address = remote.address or machine.ray_address()
    if not address:
        raise ValueError(
            "Remote(address=None) and $RAY_ADDRESS is unset: unstall joins a running Ray "
            "cluster and never starts one. Start it (`ray start --head --num-cpus=0` here, "
            "`ray start --address=HEAD:6379` on each CPU node), then pass "
            "Remote(address='HEAD:6379') or address='auto'"
        )
    if address.startswith("ray://"):
        log.warning(
            "unstall: %s is Ray Client: batches then cross through one gRPC proxy "
            "(about 0.16 GB/s); join as a node instead (`ray start --address=...`)",
            address,
        )
    main = threading.current_thread() is threading.main_thread()
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        ray.init(address=address, logging_level=logging.WARNING, configure_logging=False)
    except ConnectionError as exc:
        raise ConnectionError(
            f"Remote(address={address!r}): no Ray cluster answers ({exc})"
        ) from exc
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)
    resources = ray.cluster_resources()
    nodes = sum(1 for n in ray.nodes() if n.get("Alive"))
    log.warning(
        "unstall: joined the Ray cluster at %s (%d nodes, %g CPUs) for %d remote workers",
        address,
        nodes,
        resources.get("CPU", 0),
        remote.workers,
    )
    return address


def _address(ray: Any) -> str:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:
        return "?"
