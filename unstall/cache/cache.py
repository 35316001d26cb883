"""`Cache`: what a user passes to `unstall.DataLoader(cache=...)`, and binding it to a dataset.

A node-wide cache of raw sample bytes that fills once and never evicts. With a fresh
random order every epoch no cache of C items can hit more than C/N of the time, and
one that never evicts reaches exactly that (DESIGN.md section 2). One shared-memory
segment per dataset is shared by every worker and every job of the user on the node
(the RAM tier, `unstall.cache.ram_tier`). A local-disk tier can sit under it
(``Cache(ram="8GiB", disk="500GiB")``, `unstall.cache.disk_tier`); remote datasets get
one by default (`unstall.cache.tiers.default_layer`). `bind` opens the tiers
(`unstall.cache.opening`) and composes them (`unstall.cache.tiered.TieredLayer`).
"""

from __future__ import annotations

import random
import weakref
from typing import Any

from unstall.cache.capacity import parse_capacity
from unstall.cache.items import item_versions
from unstall.cache.opening import open_disk, open_ram
from unstall.cache.policy import policy_named
from unstall.cache.shm.keep import keep_seconds
from unstall.cache.tiered import TieredLayer
from unstall.stores.base import missing_method

#: What a cache can hold per sample (``Cache(hold=...)``).
HOLDS = ("bytes", "decoded", "samples", "auto")


class Cache:
    """Raw bytes of a dataset's samples in shared memory, and optionally on local disk below it.

    Args:
        capacity: size of the RAM (shared-memory) tier, the same as ``ram=``: bytes
            (int), a size string (``"8GiB"``, ``"500MB"``) or a float in
            (0, 1]: that fraction of the dataset's total bytes (estimated from the
            sizes of up to 256 evenly spaced samples times the sample count).
        ram: the RAM tier's size (another name for ``capacity``); None: no RAM tier.
        disk: the local-disk tier's size in the same forms, or ``"auto"`` (the dataset,
            at most half the free space of the cache directory's disk, keeping 10 GiB
            free); None: no disk tier. It lives in ``$UNSTALL_CACHE_DIR`` (default
            ``~/.cache/unstall``), is shared by the node's jobs, and outlives them.
        policy: ``"noevict"`` (default: fill until full, then keep) or ``"lru"``
            (evicts the least recently used; only for comparisons).
        name: segment name instead of the dataset fingerprint (two datasets with the
            same name must not be used at once).
        peers: `unstall.Peers()` to partition the cache across the job's nodes (each
            item cached by its owner node only, in its RAM tier or, with ``disk``, its
            disk tier; other nodes' items come from them).
        keep: seconds the RAM segment stays after its last user leaves, so the next
            job hits from its first epoch [Unit: second]; default
            ``$UNSTALL_CACHE_KEEP_S``, else 3600; 0 removes it at once. Kept segments
            are released earlier when memory is short (`unstall.cache.shm.keep`).
        hold: what the cache holds per sample: ``"bytes"`` (the default: raw bytes, so
            augmentations stay fresh), ``"samples"`` (what ``dataset[i]`` returns, for a
            deterministic preparation: `unstall.cache.points.samples`), ``"decoded"``
            (a recognized image dataset's decoded, deterministically resized images)
            or ``"auto"`` (the best of these per sample under the RAM size and the disk
            size: `unstall.cache.points`).
        deterministic: for ``hold`` other than bytes: None (default) checks that the
            preparation is deterministic on the job's own samples; True declares it (no
            check); False never caches prepared samples.

    ``bind(dataset)`` (called by `unstall.DataLoader`) maps the segment, creating it
    if no process on the node has, and switches local stores to reading around
    the page cache, so memory does not hold the data twice. Every item is stored
    with the version of its source (``dataset.versions()``: size + mtime + inode of
    a local file, size + ETag of an S3 object), and an item whose source changed
    since is a miss (``stale`` in the stats), never served. When the last process
    using the segment closes (`close`, or at exit) it is kept ``keep`` seconds, then
    removed; one left by a killed job is reclaimed by the next.

    Given to a loader whose dataset opens its files itself (no ``fetch``/``key``/
    ``fingerprint``), the cache holds those files whole instead, served to the dataset's
    own ``open(path, "rb")`` in the workers (`unstall.cache.files`,
    `unstall.loader.file_hook`); ``bind`` itself still takes only unstall's datasets.
    """

    def __init__(
        self,
        capacity: int | float | str | None = None,
        *,
        ram: int | float | str | None = None,
        disk: int | float | str | None = None,
        policy: str = "noevict",
        name: str | None = None,
        peers: Any = None,
        keep: float | None = None,
        hold: str = "bytes",
        deterministic: bool | None = None,
    ):
        if capacity is not None and ram is not None:
            raise ValueError(
                f"Cache({capacity!r}, ram={ram!r}): capacity is the RAM tier; give one"
            )
        ram = capacity if capacity is not None else ram
        if ram is None and disk is None:
            raise ValueError("Cache() needs a size: Cache('8GiB'), Cache(ram=..., disk=...)")
        self.capacity = parse_capacity(ram) if ram is not None else None
        policy_named(policy)  # a known policy, or ValueError naming them
        self.disk = disk if disk is None or disk == "auto" else parse_capacity(disk)
        if disk is not None and not policy_named(policy).stacks:
            raise ValueError(f"policy={policy!r} evicts: a disk tier needs policy='noevict'")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise ValueError(f"name={name!r} must be a non-empty string or None")
        self.policy = policy
        self.name = name
        self.peers = peers  # e.g. unstall.Peers(): a cache partitioned across nodes
        self.keep = keep if keep is None else keep_seconds(keep)  # None: the env at bind
        if hold not in HOLDS:
            raise ValueError(f"hold={hold!r} is unknown; use one of {list(HOLDS)}")
        if deterministic not in (None, True, False):
            raise ValueError(f"deterministic={deterministic!r} must be True, False or None")
        self.hold = hold
        self.deterministic = deterministic
        self._layers: list[Any] = []

    def __repr__(self) -> str:
        disk = f", disk={self.disk!r}" if self.disk is not None else ""
        hold = f", hold={self.hold!r}" if self.hold != "bytes" else ""
        return f"Cache({self.capacity!r}{disk}, policy={self.policy!r}, name={self.name!r}{hold})"

    def bind(self, dataset: Any, *, peers: Any = ..., name_prefix: str = "") -> Any:
        """Open the dataset's segment (and disk tier) and return the fetch layer for a loader.

        ``peers``: the cache's own (``Cache(peers=...)``) unless given; None binds this
        node's tiers alone (whole files, `unstall.cache.files`). ``name_prefix``: put
        before a ``name`` given to the cache (what the segment holds, e.g. ``samples-``)."""
        peers = self.peers if peers is ... else peers
        attr = missing_method(dataset)  # not a KeyedDataset
        if attr is not None:
            raise TypeError(
                f"Cache needs a dataset with fetch(indices), key(i) and fingerprint(); "
                f"{type(dataset).__name__} has no {attr}(): use unstall.FileDataset or "
                "add these methods"
            )
        n = len(dataset)
        if n == 0:
            raise ValueError(f"dataset {type(dataset).__name__} is empty: nothing to cache")
        fingerprint = str(dataset.fingerprint())
        name = None if self.name is None else name_prefix + self.name
        item_versions(dataset)  # here, once, before workers fork: they inherit the versions
        group = random.getrandbits(62) + 1  # one per bind: the owner sums its workers' slots
        ram, total = None, None
        if self.capacity is not None:
            ram, total = open_ram(
                dataset,
                self.capacity,
                policy=self.policy,
                fingerprint=fingerprint,
                name=name,
                group=group,
                keep_s=keep_seconds(self.keep),
            )
        disk = None
        if self.disk is not None:
            disk = open_disk(
                self.disk,
                dataset,
                fingerprint=fingerprint,
                name=name,
                group=group,
                total=total,
            )
        layer = TieredLayer(ram, disk)
        weakref.finalize(layer, TieredLayer.close_state, layer.__dict__)  # closed at exit
        if peers is not None:  # each node caches the items it owns; peers serve the rest
            layer.peers = peers.attach(layer, dataset)
        self._layers.append(layer)
        return layer

    def track(self, layer: Any) -> None:
        """Leave ``layer`` too on `close` (a tier bound for this cache by another `Cache`
        sized for part of its budget: mixed placement, `unstall.cache.points.placement`)."""
        self._layers.append(layer)

    def check(self) -> None:
        """Assert every bound segment's index is consistent (for tests and debugging)."""
        for layer in self._layers:
            layer.check()

    def close(self) -> None:
        """Leave every segment this cache bound (removing those no one else uses). Idempotent."""
        for layer in self._layers:
            layer.close()

    def __enter__(self) -> Cache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
