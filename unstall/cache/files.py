"""The node cache for datasets that open files themselves: whole files, keyed by path.

Most scripts use a dataset of their own (or torchvision's) whose ``__getitem__`` opens a
file by path. `bind_files` gives such a dataset the same node-wide cache as unstall's
own datasets: it lists the files the dataset names (torchvision's ``samples`` / ``imgs``,
or the longest list of paths among its attributes), numbers them in sorted order of their
real paths, and binds `unstall.Cache` to that listing (`FileListing`): one segment per set
of files, shared by every worker and every job on the node that lists the same files,
sized and kept by the cache's usual rules. The loader's workers then serve whole-file
reads of those files from it (`unstall.loader.file_hook`), through `FileCache.read`.

Each file is stored under the version of the file it was read from: size, mtime, inode
and device, taken by ``fstat`` of the file the reader opened. A read of a file whose
version changed since is a miss (``stale``), never served old bytes. A file modified in
the last `RECENT_NS` is read from the file and not stored (its mtime could still be the
one a later write in the same tick leaves), so files a job writes itself stay uncached.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from unstall.cache.capacity import format_bytes
from unstall.stores.listing import mix_ints
from unstall.stores.local import drop_page_cache as drop_page_cache  # cold runs of the files

log = logging.getLogger("unstall")

#: Files larger than this are never cached: their reads go to the file itself.
MAX_FILE_BYTES = 64 << 20
#: A file modified less than this long ago is served from the file, never stored: a write
#: within the same timestamp tick as the read it was stored from would leave its version
#: unchanged ("racy" mtimes, as git's index). Files a dataset writes itself stay uncached.
RECENT_NS = 2_000_000_000
#: Attributes looked at first for a dataset's files (torchvision's, then common names).
NAMED = ("samples", "imgs", "files", "paths", "file_paths", "image_paths", "filenames")
#: Wrappers followed to the dataset that lists the files (``Subset.dataset``...).
_WRAPPED = ("dataset", "base", "inner")


class NoListing(Exception):
    """The dataset names no files the cache could serve (the message says why)."""


def file_version(st: os.stat_result) -> int:
    """A file's version: nonzero int64 of its size, mtime, inode and device."""
    return mix_ints(st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def listed_paths(dataset: Any) -> tuple[list[str], str]:
    """The paths of the files ``dataset`` lists, and where they were found
    (``"samples"``, ``"dataset.paths"``...).

    Raises:
        NoListing: no attribute lists existing files.
    """
    best: tuple[int, list[Any], str] | None = None
    obj, prefix = dataset, ""
    for _ in range(4):
        attrs = getattr(obj, "__dict__", {})
        for name in (*NAMED, *sorted(attrs)):
            entries = _paths_in(attrs.get(name))
            if entries is not None and (best is None or len(entries) > best[0]):
                best = (len(entries), entries, prefix + name)
            if best is not None and name in NAMED:
                break  # a list under a known name wins over any longer one
        wrapper = next((w for w in _WRAPPED if hasattr(obj, w)), None)
        if best is not None or wrapper is None:
            break
        obj, prefix = getattr(obj, wrapper), f"{prefix}{wrapper}."
    if best is None:
        raise NoListing(
            f"{type(dataset).__name__} lists no files (no samples/imgs or list of paths "
            "among its attributes)"
        )
    return [os.path.abspath(p) for p in best[1]], best[2]


def _paths_in(value: Any) -> list[str] | None:
    """The paths in ``value`` if it is a list of existing file paths (or of tuples whose first
    element is one, as torchvision's ``samples``); else None."""
    if isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "UO":
        value = value.tolist()
    if not isinstance(value, (list, tuple)) or not value:
        return None
    first = value[0]
    pick = isinstance(first, (tuple, list)) and len(first) > 0
    if not isinstance(first[0] if pick else first, (str, os.PathLike)):
        return None
    try:
        raw = [e[0] if pick else e for e in value]
        paths = [os.fspath(p) for p in raw if isinstance(p, (str, os.PathLike))]
    except (TypeError, IndexError):
        return None
    if len(paths) != len(value) or not all(isinstance(p, str) for p in paths[:1]):
        return None
    probe = {paths[0], paths[len(paths) // 2], paths[-1]}
    return paths if all(os.path.isfile(p) for p in probe) else None


class _Paths:
    """A store-like view of the listing: ``path(key)`` is the key (sizes for fractions)."""

    url = "file"

    @staticmethod
    def path(key: str) -> str:
        return key


class FileListing:
    """The files a dataset lists, as `unstall.Cache` binds datasets: key ``i`` is the ``i``-th
    path in sorted order; the fingerprint names the set of files."""

    def __init__(self, paths: Sequence[str]):
        self.paths = sorted(set(real_dir_path(p) for p in paths))
        self.store = _Paths()
        digest = hashlib.blake2b(digest_size=16)
        for p in self.paths:
            digest.update(p.encode("utf-8", "surrogateescape") + b"\0")
        self._fingerprint = digest.hexdigest()

    def __len__(self) -> int:
        return len(self.paths)

    def key(self, i: int) -> str:
        return self.paths[i]

    def fingerprint(self) -> str:
        return self._fingerprint

    def fetch(self, indices: Sequence[int]) -> list[bytes]:
        out = []
        for i in indices:
            with open(self.paths[i], "rb") as f:
                out.append(f.read())
        return out


_dirs: dict[str, str] = {}
_announced: set[str] = set()


def real_dir_path(path: str) -> str:
    """``path`` absolute, with its directory's symbolic links resolved (remembered per
    directory); the file's own name is kept (its version says which file it is)."""
    head, tail = os.path.split(os.path.abspath(path))
    real = _dirs.get(head)
    if real is None:
        real = _dirs[head] = os.path.realpath(head)
    return os.path.join(real, tail)


def tier_get(layer: Any, index: int, version: np.ndarray) -> tuple[bytes | None, list]:
    """Item ``index`` from the first of ``layer``'s tiers holding it under ``version`` (None:
    a miss), and per tier asked ``(hit, stale)``."""
    found: list[tuple[int, int]] = []
    for tier in layer.tiers:
        got, stale = tier.get_many([index], version)
        found.append((int(got[0] is not None), stale))
        if got[0] is not None:
            return got[0], found
    return None, found


def tier_put(layer: Any, index: int, data: bytes, version: np.ndarray, tiers: int) -> list:
    """``data`` to the first of ``layer``'s first ``tiers`` tiers that takes it: (items,
    bytes) stored per tier."""
    out: list[tuple[int, int]] = []
    since = layer.bound_ns
    for tier in layer.tiers[:tiers]:
        out.append(tier.put_many([(index, data)], version, since))
        if out[-1][0] or tier.held([index], version, since)[0]:
            break  # stored, or held (another process stores it, or a newer job's)
    return out + [(0, 0)] * (tiers - len(out))


def tier_count(layer: Any, found: list, stored: list) -> None:
    """One access's figures to each tier asked: ``found`` per tier, ``stored`` per tier."""
    for tier, (hit, stale), (n, size) in zip(layer.tiers, found, stored, strict=False):
        tier.count(hit, 1 - hit, n, size, stale)


class ItemLayer:
    """What a loader holds of a cache served item by item in its workers (whole files, or
    prepared samples: `unstall.cache.points`): the tiers (``layer``), closing, checking,
    and the fetch-layer calls a dataset that is not split passes through."""

    def __init__(self, layer: Any):
        self.layer = layer
        #: Called by `close` (e.g. the main process's open hook removing itself).
        self.on_close: list[Any] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["on_close"] = []
        return state

    def fetch(self, dataset: Any, indices: Sequence[int]) -> list[bytes]:
        """The dataset's own fetch (its reads are served in the workers)."""
        return list(dataset.fetch(indices))

    def prefetch(self, dataset: Any, indices: Sequence[int]) -> None:
        prefetch = getattr(dataset, "prefetch", None)
        if callable(prefetch):
            prefetch(indices)

    def check(self) -> None:
        self.layer.check()

    def close(self) -> bool:
        """Leave the segment (owner process only); idempotent."""
        for hook in self.on_close:
            hook(self)
        self.on_close = []
        return bool(self.layer.close())


class FileCache(ItemLayer):
    """A bound cache of whole files (see the module notes): the loader's layer for a dataset
    that opens files itself. ``read`` is what the workers' open hook calls."""

    def __init__(self, layer: Any, listing: FileListing, where: str, dataset_name: str):
        super().__init__(layer)
        self.where = where
        self.dataset_name = dataset_name
        self.files = len(listing)
        self.paths = listing.paths
        self.slot_of = {p: i for i, p in enumerate(listing.paths)}
        self.max_bytes = MAX_FILE_BYTES
        #: Merged into the stats' ``cache`` section (e.g. why samples were not cached).
        self.notes: dict[str, Any] = {}

    def index_of(self, path: str) -> int | None:
        """The item of ``path`` (as opened), or None if the dataset does not list it."""
        slot = self.slot_of.get(path)
        if slot is None:
            slot = self.slot_of.get(real_dir_path(path))
        return slot

    def read(
        self, index: int, st: os.stat_result, read_file: Any, restat: Any = None
    ) -> tuple[bytes, bool]:
        """The bytes of item ``index`` whose file, as opened, has stat ``st``: from the first
        tier holding that version, else ``read_file()``, then stored if the file is as it
        was (all ``st.st_size`` bytes read, ``restat()`` of the same version) and was not
        modified in the last `RECENT_NS`. Returns ``(bytes, stored)``."""
        version = np.array([file_version(st)], dtype=np.int64)
        data, found = tier_get(self.layer, index, version)
        stored = [(0, 0)] * len(found)
        if data is None:
            data = read_file()
            settled = time.time_ns() - st.st_mtime_ns > RECENT_NS
            unchanged = len(data) == st.st_size and settled
            if unchanged and (restat is None or file_version(restat()) == int(version[0])):
                stored = tier_put(self.layer, index, data, version, len(found))
        tier_count(self.layer, found, stored)
        return data, any(n for n, _ in stored)

    def fill(self, indices: Sequence[int]) -> int:
        """Read the files of ``indices`` into the cache now (e.g. the analyzer's cached run,
        before timing); returns how many were stored."""
        stored = 0
        for i in indices:
            fd = os.open(self.paths[i], os.O_RDONLY)
            try:
                st = os.fstat(fd)
                if not is_regular(st) or st.st_size > self.max_bytes:
                    continue
                _, put = self.read(i, st, lambda fd=fd, n=st.st_size: _read_all(fd, n))
                stored += put
            finally:
                os.close(fd)
        return stored

    def stats(self) -> dict[str, Any]:
        """The cache's figures (``{"cache": {...}}``), with ``level: "file"`` and the listing."""
        out = self.layer.stats()
        out["cache"].update(level="file", files=self.files, listed=self.where, **self.notes)
        return out


def bind_files(cache: Any, dataset: Any) -> FileCache | None:
    """``cache`` (an `unstall.Cache`) bound to the files ``dataset`` lists, or None with one
    line saying why it cannot apply (the job then runs uncached: never an error)."""
    name = type(dataset).__name__
    try:
        paths, where = listed_paths(dataset)
        listing = FileListing(paths)
        layer = cache.bind(listing, peers=None)  # node by node: peers serve unstall's datasets
    except Exception as exc:  # a recommended setting must never end the job
        why = str(exc) if isinstance(exc, NoListing) else f"{type(exc).__name__}: {exc}"
        say(f"unstall: cache not applied to {name}: {why}; running uncached")
        return None
    files = FileCache(layer, listing, where, name)
    if listing.fingerprint() in _announced:  # one line per set of files and process
        return files
    _announced.add(listing.fingerprint())
    ram = layer.ram
    size = format_bytes(ram.capacity) if ram is not None and ram.path else "no RAM tier"
    extra = "; peers are not used for file-level caching" if cache.peers is not None else ""
    say(
        f"unstall: caching the {len(listing)} files {name}.{where} lists, whole files up to "
        f"{format_bytes(MAX_FILE_BYTES)}, in the node cache ({size}){extra}"
    )
    return files


def _read_all(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.pread(fd, left, size - left)
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def is_regular(st: os.stat_result) -> bool:
    return stat.S_ISREG(st.st_mode)


def say(line: str) -> None:
    """One line to the ``unstall`` logger, or to stderr when logging is not set up."""
    if log.hasHandlers():
        log.info(line)
    else:
        print(line, file=sys.stderr, flush=True)
