"""``remote=``: where batches are also prepared, declared once and checked at construction.

`Remote` names a Ray cluster and how many workers (Ray actors) to run on it. The loader
(`unstall.loader`) never imports this package: it hands the value, a `Remote` or the plain
dict a config file holds (``unstall run --config`` with ``{"kwargs": {"remote": {...}}}``),
to the ``"remote"`` extension (`unstall.remote.plugin`), which checks it with `Remote.of`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from unstall.sizes import parse_size

#: Backends ``Remote`` takes.
BACKENDS = ("ray",)
#: What the loader does when no remote worker is left for ``timeout_s``.
FALLBACKS = ("local", "raise")


@dataclass(frozen=True)
class Remote:
    """Workers on other machines: Ray actors that prepare whole batches for this loader.

    The loader's own order decides every batch; each actor builds the dataset once and
    prepares the batches it is sent, seeded from (seed, epoch, batch) as local workers
    are, and the training loop receives them in the loader's order. Local workers fill
    first; remote ones take what they cannot. unstall never starts a cluster: it joins
    the one named.

    Args:
        backend: ``"ray"`` (``pip install 'unstall[ray]'``).
        address: the cluster to join (``"ray://..."`` is Ray Client, far too slow for
            data; give the head's ``host:port`` or ``"auto"``); None: ``$RAY_ADDRESS``, or
            the cluster this process already joined (``ray.init`` called by the script).
        workers: actors to start (each takes ``cpus_per_worker`` CPUs of the cluster).
        cpus_per_worker: Ray CPUs each actor reserves.
        resources: extra Ray resources each actor reserves (e.g. ``{"prep": 1}`` to keep
            them on nodes started with ``--resources='{"prep": 16}'``).
        tasks_per_worker: batches sent to one actor at a time (>= 1).
        max_bytes_in_flight: a cap on the bytes of remote batches sent for and not yet
            handed to the loop (an int, or ``"512MiB"``); keep it under the trainer
            node's object store so nothing spills.
        timeout_s: how long batches may wait with no remote worker alive before
            ``fallback`` (seconds).
        fallback: ``"local"`` (the waiting batches are prepared in this process, later
            ones by local workers) or ``"raise"`` (an error naming the lost nodes).
        wait_up_s: how long the first epoch waits for the actors to be up (they build the
            dataset first; 0: local workers start at once and actors join as they come up).
    """

    backend: str = "ray"
    address: str | None = None
    workers: int = 2
    cpus_per_worker: float = 1.0
    resources: dict[str, float] = field(default_factory=dict)
    tasks_per_worker: int = 2
    max_bytes_in_flight: int | str = "1GiB"
    timeout_s: float = 60.0
    fallback: str = "local"
    wait_up_s: float = 0.0

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"Remote(backend={self.backend!r}) must be one of {BACKENDS}")
        if self.address is not None and not isinstance(self.address, str):
            raise ValueError(f"Remote(address={self.address!r}) must be a str like 'host:6379'")
        _positive_int("workers", self.workers)
        _positive_int("tasks_per_worker", self.tasks_per_worker)
        if not _number(self.cpus_per_worker) or self.cpus_per_worker < 0:
            raise ValueError(
                f"Remote(cpus_per_worker={self.cpus_per_worker!r}) must be a number >= 0"
            )
        if not isinstance(self.resources, dict) or not all(
            isinstance(k, str) and _number(v) and v >= 0 for k, v in self.resources.items()
        ):
            raise ValueError(
                f"Remote(resources={self.resources!r}) must map resource names to numbers >= 0"
            )
        object.__setattr__(self, "resources", dict(self.resources))
        object.__setattr__(self, "max_bytes_in_flight", parse_bytes(self.max_bytes_in_flight))
        if not _number(self.timeout_s) or self.timeout_s <= 0:
            raise ValueError(f"Remote(timeout_s={self.timeout_s!r}) must be a number > 0")
        if not _number(self.wait_up_s) or self.wait_up_s < 0:
            raise ValueError(f"Remote(wait_up_s={self.wait_up_s!r}) must be a number >= 0")
        if self.fallback not in FALLBACKS:
            raise ValueError(f"Remote(fallback={self.fallback!r}) must be one of {FALLBACKS}")

    @classmethod
    def of(cls, value: Any) -> Remote:
        """``value`` as a `Remote`: one already, or the dict of its fields a config holds."""
        if isinstance(value, Remote):
            return value
        if isinstance(value, dict):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"remote={value!r}: unknown keys {unknown}; use {sorted(known)}")
            return cls(**value)
        raise ValueError(
            f"remote={value!r} must be an unstall.Remote(...) or a dict of its fields "
            '(e.g. {"address": "head:6379", "workers": 4})'
        )


def parse_bytes(value: Any) -> int:
    """A byte count from an int or a size like ``"512MiB"`` (> 0; `unstall.sizes`)."""
    bad = f"Remote(max_bytes_in_flight={value!r}) must be a byte count or a size like '512MiB'"
    if isinstance(value, int) and not isinstance(value, bool):
        n = value
    elif isinstance(value, str):
        try:
            n = parse_size(value)
        except ValueError:
            raise ValueError(bad) from None
    else:
        raise ValueError(bad)
    if n <= 0:
        raise ValueError(f"Remote(max_bytes_in_flight={value!r}) must be > 0")
    return n


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"Remote({name}={value!r}) must be an int >= 1")


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
