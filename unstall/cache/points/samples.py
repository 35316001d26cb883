"""The whole-sample cache (``Cache(size, hold="samples")``): what ``dataset[i]`` returns,
prepared once and served from the node cache from then on, bit-identical.

For a map-style dataset whose preparation is deterministic (a validation set, audio
decoded and resampled, extracted features), the loader's workers call
``dataset[i]`` through `CachedSamples`: a hit is the stored sample decoded
(`unstall.cache.points.codec`), a miss prepares it as the script would, returns it, and
stores its encoding. The dataset stays the script's own: an opaque ``__getitem__`` that
opens its files in C (soundfile, torchcodec) is served too, since the sample, not the
file, is what is cached.

Binding (`bind_samples`, in the loader's main process, once):

1. **The files behind each sample.** The dataset must list one file per sample, in its
   own order (torchvision's ``samples``/``imgs``, or the longest list of existing paths
   among its attributes, as the file hook finds them: `unstall.cache.files.listed_paths`);
   a `torch.utils.data.Subset` of one such dataset picks its files by its ``indices``.
   Sample ``i``'s version is its file's (size, mtime, inode, device), taken by ``stat``
   each time it is asked for: a changed file is a miss (``stale``), never an old sample.
   A dataset that lists no such files is not sample-cached (its samples could not be
   versioned). One of unstall's own keyed datasets (`unstall.data.FileDataset` and its
   kin: `unstall.stores.base.KeyedDataset`) is versioned as the byte cache versions its
   items instead: its store's version of each item (size, mtime, inode of a local file;
   size and ETag of an object), taken once at bind and inherited by the workers, so a
   job bound after an item changed prepares it again; a store that gives no versions is
   not sample-cached.
2. **Determinism** (`unstall.cache.points.determinism`): known from recognized ops, else
   checked on the job's own samples; ``Cache(deterministic=True|False)`` decides instead.
3. **The preparation's fingerprint** (`unstall.cache.points.fingerprint`): the segment is
   named by it and by the listed paths (a keyed dataset's own fingerprint: its store and
   keys), so a changed transform, loader function or
   unstall gives another segment, and jobs with the same preparation share one.

A dataset refused at 1 or 2 gets the byte cache instead (its files, whole), with one
line saying which check failed; ``loader.stats()["cache"]`` carries it.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch.utils.data

from unstall.cache.capacity import entry_bytes, format_bytes
from unstall.cache.files import (
    RECENT_NS,
    ItemLayer,
    NoListing,
    file_version,
    listed_paths,
    say,
    tier_count,
    tier_get,
    tier_put,
)
from unstall.cache.items import item_versions
from unstall.cache.points import codec
from unstall.cache.points.determinism import Verdict, verdict_for
from unstall.cache.points.fingerprint import preparation_fingerprint
from unstall.stores.base import is_keyed

#: Encoded samples larger than this are never stored.
MAX_SAMPLE_BYTES = 256 << 20
#: A keyed dataset's attributes its entries' keys stand for (the store and keys, by the
#: dataset's own fingerprint; the versions, per entry) or that change as it is used.
KEYED_STATE = ("store", "keys", "_versions", "_versioned")
_announced: set[str] = set()


class Refused(Exception):
    """The dataset cannot be sample-cached; ``stats`` says which check failed."""

    def __init__(self, stats: dict[str, Any]):
        super().__init__(stats["reason"])
        self.stats = stats


class SampleListing:
    """A dataset's samples as `unstall.Cache.bind` binds items: one per index; the
    fingerprint names the held kind, the preparation and the files."""

    def __init__(self, n: int, fingerprint: str, sample_bytes: float):
        self.n, self._fingerprint, self.sample_bytes = n, fingerprint, sample_bytes

    def __len__(self) -> int:
        return self.n

    def key(self, i: int) -> str:
        return str(i)

    def fingerprint(self) -> str:
        return self._fingerprint

    def raw_sizes(self, indices: Sequence[int]) -> np.ndarray:
        """Each sample's expected stored size (the checked samples' mean, with a margin)."""
        return np.full(len(indices), int(self.sample_bytes), dtype=np.int64)

    def fetch(self, indices: Sequence[int]) -> list[bytes]:
        raise NotImplementedError("samples are stored by the loader's workers, not fetched")


class SampleCache(ItemLayer):
    """A bound sample cache: the tiers, the files behind the samples and how it was decided.

    `serve` gives the dataset the loader's workers call; `stats` the cache's figures."""

    def __init__(
        self,
        layer: Any,
        paths: Sequence[str],
        *,
        hold: str,
        where: str,
        dataset_name: str,
        fingerprint: str,
        verdict: Verdict,
        versions: np.ndarray | None = None,
    ):
        super().__init__(layer)
        self.paths, self.hold, self.where = paths, hold, where
        self.dataset_name, self.fingerprint, self.verdict = dataset_name, fingerprint, verdict
        #: Each sample's version, taken at bind, for a keyed dataset (its store's item
        #: versions, as the byte cache keys them); None: its file's, by ``stat`` per access.
        self.versions = versions

    def serve(self, dataset: Any) -> CachedSamples:
        """``dataset`` with its samples served through this cache."""
        return CachedSamples(dataset, self)

    def get(self, index: int, prepare: Any) -> Any:
        """Sample ``index``: from the first tier holding it under its version (its file's
        now, or its item's at bind), else ``prepare(index)``, stored when its file did not
        change meanwhile."""
        st = None
        if self.versions is not None:
            version = self.versions[index : index + 1]
        else:
            st = os.stat(self.paths[index])
            version = np.array([file_version(st)], dtype=np.int64)
        data, found = tier_get(self.layer, index, version)
        stored = [(0, 0)] * len(found)
        if data is not None:
            sample = codec.decode(data)
        else:
            sample = prepare(index)
            if st is None or self._unchanged(index, st, int(version[0])):
                encoded = codec.encode(sample)
                if len(encoded) <= MAX_SAMPLE_BYTES:
                    stored = self.put(index, encoded, version, len(found))
        tier_count(self.layer, found, stored)
        return sample

    def _unchanged(self, index: int, st: os.stat_result, version: int) -> bool:
        """Sample ``index``'s file is as it was before preparing it, and settled."""
        settled = time.time_ns() - st.st_mtime_ns > RECENT_NS
        return settled and file_version(os.stat(self.paths[index])) == version

    def put(self, index: int, data: bytes, version: np.ndarray, asked: int) -> list:
        """``data`` to the first of the ``asked`` tiers that takes it: (items, bytes) per tier."""
        return tier_put(self.layer, index, data, version, asked)

    def stats(self) -> dict[str, Any]:
        """``{"cache": {...}}``: the tiers' figures, what they hold and how it was decided."""
        out = self.layer.stats()
        out["cache"].update(
            level=self.hold,
            holds=self.hold,
            samples=len(self.paths),
            listed=self.where,
            preparation=self.fingerprint,
            **self.verdict.as_stats(),
        )
        return out


class CachedSamples(torch.utils.data.Dataset):
    """The script's dataset with ``__getitem__`` served through a `SampleCache`."""

    def __init__(self, dataset: Any, cache: SampleCache):
        self.dataset, self.cache = dataset, cache

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.cache.get(index, self.dataset.__getitem__)


def sample_files(dataset: Any) -> tuple[list[str], str]:
    """The file behind each of ``dataset``'s samples, in its order, and where they are listed.

    Raises:
        Refused: no attribute lists one existing file per sample.
    """
    name = type(dataset).__name__
    picked = getattr(dataset, "indices", None)
    inner = getattr(dataset, "dataset", None)
    if inner is not None and isinstance(picked, Sequence) and len(picked) == len(dataset):
        # a Subset (random_split's validation part): the inner dataset's files, picked
        paths, where = sample_files(inner)
        return [paths[int(i)] for i in picked], f"dataset.{where}[indices]"
    try:
        paths, where = listed_paths(dataset)
    except NoListing as exc:
        raise Refused(refusal("files", f"{exc}: its samples cannot be versioned")) from None
    if len(paths) != len(dataset):
        why = (
            f"{name}.{where} lists {len(paths)} files for {len(dataset)} samples: "
            "one file per sample is needed to version them"
        )
        raise Refused(refusal("files", why))
    return paths, where


def bind_samples(cache: Any, dataset: Any, hold: str = "samples") -> SampleCache:
    """``cache`` (an `unstall.Cache`) bound to ``dataset``'s prepared samples.

    Raises:
        Refused: the dataset lists no file per sample, or its preparation is not (known to
            be) deterministic; the stats say which check failed.
    """
    name = type(dataset).__name__
    versions, ignore = None, ()
    if is_keyed(dataset):  # unstall's own: versioned by its store, as the byte cache is
        versions, where = keyed_versions(dataset)
        keys = getattr(dataset, "keys", None)  # FileDataset's compact KeyTable
        if not isinstance(keys, Sequence) or len(keys) != len(dataset):
            keys = [str(dataset.key(i)) for i in range(len(dataset))]
        paths = keys  # each sample's key, in its order (not read: versions are per item)
        ignore = KEYED_STATE
        listed = f"keyed {type(dataset.store).__qualname__} {dataset.fingerprint()}"
    else:
        paths, where = sample_files(dataset)
        listed = paths_digest(paths)
    sizes: list[int] = []

    def prepared(i: int) -> bytes:
        out = codec.encode(dataset[i])
        sizes.append(len(out))
        return out

    verdict = verdict_for(dataset, prepared, getattr(cache, "deterministic", None))
    if not verdict.ok:
        raise Refused({**verdict.as_stats(), "holds": "bytes"})
    if not sizes:  # declared deterministic: one sample sizes the segment
        prepared(0)
    fingerprint = preparation_fingerprint(dataset, hold, listed, ignore=ignore)
    layer, per_sample = bind_segment(cache, hold, fingerprint, len(paths), float(np.mean(sizes)))
    bound = SampleCache(
        layer,
        paths,
        hold=hold,
        where=where,
        dataset_name=name,
        fingerprint=fingerprint,
        verdict=verdict,
        versions=versions,
    )
    announce(bound, f"{name}'s {len(paths)} prepared samples", per_sample)
    return bound


def keyed_versions(dataset: Any) -> tuple[np.ndarray, str]:
    """A keyed dataset's item versions (its store's, taken once: `unstall.cache.items`).

    Raises:
        Refused: its store gives no versions (a changed item could not be told apart).
    """
    name = type(dataset).__name__
    try:
        versions = item_versions(dataset)
    except Exception as exc:  # the store's listing failed: its bytes are cached instead
        why = f"listing {name}'s item versions failed ({type(exc).__name__}: {exc})"
        raise Refused(refusal("versions", why)) from None
    if versions is None:
        why = f"{name}'s store gives no item versions: its samples cannot be versioned"
        raise Refused(refusal("versions", why))
    return np.asarray(versions, dtype=np.int64), "store versions"


def paths_digest(paths: Sequence[str]) -> str:
    """A digest of the listed paths, in order (a dataset over other files is another one)."""
    digest = hashlib.blake2b(digest_size=16)
    for p in paths:
        digest.update(p.encode("utf-8", "surrogateescape") + b"\0")
    return digest.hexdigest()


def bind_segment(
    cache: Any,
    hold: str,
    fingerprint: str,
    n: int,
    mean_bytes: float,
    capacity: int | None = None,
    disk: int | None = None,
) -> tuple[Any, int]:
    """The tiers of a ``hold`` segment of ``n`` entries of about ``mean_bytes`` each, and the
    bytes planned per entry: the cache's own tiers, or (``capacity`` or ``disk`` given) a
    RAM tier of ``capacity`` bytes and a disk tier of ``disk`` bytes (None: none)."""
    per_sample = entry_bytes(mean_bytes)
    listing = SampleListing(n, f"{hold}-{fingerprint}", per_sample)
    if capacity is not None or disk is not None:
        from unstall.cache.cache import Cache

        sized = Cache(ram=capacity, disk=disk, keep=cache.keep, name=cache.name, hold=hold)
        layer = sized.bind(listing, peers=None, name_prefix=f"{hold}-")
        cache.track(layer)  # the user's cache leaves it on close
        return layer, per_sample
    return cache.bind(listing, peers=None, name_prefix=f"{hold}-"), per_sample


def announce(bound: SampleCache, what: str, per_sample: int) -> None:
    """One line per segment and process: what is cached, how decided, the room."""
    if bound.fingerprint in _announced:
        return
    _announced.add(bound.fingerprint)
    ram, disk = bound.layer.ram, getattr(bound.layer, "disk", None)
    size = format_bytes(ram.capacity) if ram is not None and ram.path else "no RAM tier"
    if disk is not None and disk.path:
        size += f", {format_bytes(disk.capacity)} on disk"
    say(
        f"unstall: caching {what} (deterministic: {bound.verdict.how}; about "
        f"{format_bytes(per_sample)} each) in the node cache ({size})"
    )


def refusal(check: str, reason: str) -> dict[str, Any]:
    return {
        "deterministic": False,
        "determinism": "refused",
        "failed_check": check,
        "reason": reason,
        "holds": "bytes",
    }
