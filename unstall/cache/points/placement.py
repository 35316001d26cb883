"""Binding the decoded point (``hold="decoded"``) and mixed placement (``hold="auto"``).

``hold="decoded"`` caches a recognized folder's prefix output for every sample the budget
holds (first come, kept: the cache's usual rule), in the cache's own RAM and disk tiers.
``hold="auto"`` plans, per sample, whether it is held decoded, as its file's bytes, or not
at all, and in which tier, under the cache's RAM size and disk size (``Cache(size,
disk=...)``), by the CPU seconds saved per byte measured on the job's own samples
(`unstall.cache.points.planning`). Each part gets tiers sized for what the plan puts
there: the decoded entries a segment whose RAM and disk tiers hold the samples planned
for each (a decoded entry goes to the tier planned for it, never the other), the byte
entries a file cache of the other samples' files, RAM then disk. Both are named, kept
and cleaned up by the cache's usual rules: the RAM segments leave with their last user
(after ``keep``), the disk tiers' files stay for the next job.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from unstall.cache.disk_files import auto_disk_bytes, tier_dir
from unstall.cache.files import FileCache, FileListing
from unstall.cache.points.decoded import DecodedCache, PrefixOf, Split, loader_verdict
from unstall.cache.points.fingerprint import preparation_fingerprint
from unstall.cache.points.planning import MEASURED, measure, plan
from unstall.cache.points.samples import (
    Refused,
    announce,
    bind_segment,
    paths_digest,
    refusal,
)

#: Room added to each part's tiers over what the plan puts there.
SLACK = 1.02
SLACK_BYTES = 1 << 20


def bind_decoded(cache: Any, dataset: Any, split: Split, hold: str) -> DecodedCache:
    """``cache`` bound to ``dataset``'s prefix outputs: all of them (``decoded``) or as
    planned with the other samples' bytes (``auto``).

    Raises:
        Refused: the loader function is not deterministic (or opted out), or ``auto``
            has neither a RAM size nor a disk size in bytes.
    """
    name = type(dataset).__name__
    n = len(split.paths)
    picks = sorted({round(j * (n - 1) / max(MEASURED - 1, 1)) for j in range(MEASURED)})
    verdict = loader_verdict(split, getattr(cache, "deterministic", None), picks[:3])
    if not verdict.ok:
        raise Refused({**verdict.as_stats(), "holds": "bytes"})
    fingerprint = preparation_fingerprint(PrefixOf(split), "decoded", paths_digest(split.paths))
    args = dict(hold="decoded", where="samples", dataset_name=name, verdict=verdict)
    if hold == "decoded":
        costs = measure(split.head, split.paths, picks)
        layer, per = bind_segment(cache, "decoded", fingerprint, n, costs["decoded_bytes"])
        bound = DecodedCache(layer, split, fingerprint=fingerprint, **args)
        announce(bound, f"{name}'s {n} images after {split.describe()}", per)
        return bound
    sizes = np.array([os.stat(p).st_size for p in split.paths], dtype=np.float64)
    budget = int(cache.capacity) if isinstance(cache.capacity, int) else 0
    disk = _disk_budget(cache.disk, sizes)
    if budget <= 0 and disk <= 0:
        raise Refused(refusal("budget", "hold='auto' needs a RAM or disk size in bytes"))
    costs = measure(split.head, split.paths, picks, tier_dir() if disk > 0 else None)
    chosen = plan(sizes, costs, budget, disk)
    layer: Any = _NoTier()
    per = 0
    if chosen.decoded.any():
        layer, per = bind_segment(
            cache,
            "decoded",
            fingerprint,
            n,
            costs["decoded_bytes"],
            capacity=_room(chosen.decoded_bytes),
            disk=_room(chosen.disk_decoded_bytes),
        )
    bound = DecodedCache(
        layer, split, only=chosen.decoded.tolist(), fingerprint=fingerprint, **args
    )
    bound.hold = "auto"
    bound.plan = chosen
    if layer.ram is not None and layer.disk is not None:  # each entry to its planned tier
        bound.tier_of = chosen.on_disk.astype(np.uint8).tobytes()
    elif layer.disk is not None:
        bound.tier_of = bytes(n)  # the disk is the segment's only tier
    if chosen.as_bytes.any():
        bound.files = _bind_bytes(
            cache,
            [split.paths[i] for i in np.flatnonzero(chosen.as_bytes)],
            _room(chosen.file_bytes),
            _room(chosen.disk_file_bytes),
            name,
        )
    decoded, on_disk = int(chosen.decoded.sum()), int((chosen.decoded & chosen.on_disk).sum())
    as_bytes = int(chosen.as_bytes.sum())
    where = f" ({on_disk} decoded and {int(chosen.on_disk.sum()) - on_disk} files on disk)"
    announce(
        bound,
        f"{name}: {decoded} of {n} images after {split.describe()} and {as_bytes} files' "
        f"bytes{where if chosen.on_disk.any() else ''} (saves {chosen.saved_s:.1f} CPU s an "
        f"epoch by measure; bytes alone {chosen.bytes_only_saved_s:.1f} s)",
        per,
    )
    return bound


def _disk_budget(disk: Any, file_sizes: np.ndarray) -> int:
    """The bytes ``Cache(disk=...)`` gives the plan: its size; ``"auto"``, what the disk
    can spare for every sample decoded (about 5x the files, `auto_disk_bytes`); a
    fraction, of the files' bytes; 0 with no disk tier."""
    if disk is None:
        return 0
    if disk == "auto":
        return auto_disk_bytes(int(file_sizes.sum() * 8))
    if isinstance(disk, float):
        return int(disk * float(file_sizes.sum()))
    return int(disk)


def _room(planned: int) -> int | None:
    """A tier's size for ``planned`` bytes of entries (None: the plan puts none there)."""
    return int(planned * SLACK) + SLACK_BYTES if planned > 0 else None


def _bind_bytes(
    cache: Any, paths: list[str], ram: int | None, disk: int | None, name: str
) -> FileCache:
    """A byte cache of ``paths``' whole files, with a RAM tier of ``ram`` bytes and a disk
    tier of ``disk`` bytes (None: none)."""
    from unstall.cache.cache import Cache

    listing = FileListing(paths)
    sized = Cache(ram=ram, disk=disk, keep=cache.keep, name=cache.name)
    layer = sized.bind(listing, peers=None)
    cache.track(layer)  # the user's cache leaves it on close
    return FileCache(layer, listing, "samples (planned)", name)


class _NoTier:
    """The decoded part of a plan that decodes nothing: no segment."""

    def __init__(self) -> None:
        self.tiers: list[Any] = []
        self.ram = self.disk = None
        self.bound_ns = 0

    def stats(self) -> dict[str, Any]:
        return {"cache": {"enabled": False, "hits": 0, "misses": 0, "inserted_bytes": 0}}

    def check(self) -> None:
        return None

    def close(self) -> bool:
        return False
