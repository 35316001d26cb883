"""Binding the decoded point (``hold="decoded"``) and mixed placement (``hold="auto"``).

``hold="decoded"`` caches a recognized folder's prefix output for every sample the budget
holds (first come, kept: the cache's usual rule). ``hold="auto"`` plans, per sample,
whether it is held decoded, as its file's bytes, or not at all, under the one budget,
by the CPU seconds saved per byte (`plan`), measured on the job's own samples:

- a decoded entry saves reading the file and running the prefix (decode, resize...), and
  costs the prefix output's bytes (an image's pixels, about 5x its JPEG);
- a byte entry saves reading the file and costs its size.

Per-sample sizes are the files' (``stat``) and, for the decoded entries, the file's size
times the measured ratio of decoded to file bytes (the measured size when the prefix
gives one size, as ``CenterCrop`` does). The plan tries every share of decoded samples
(the smallest first: the most samples per byte) on a grid, the rest of the budget going to
the other samples' bytes, and takes the one saving the most; with no room for a decoded
entry that pays, it is the byte cache itself, so a mixed cache never does worse than a
byte cache of the same size by its own measure. Only a RAM tier is used.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from unstall.cache.files import FileCache, FileListing
from unstall.cache.points import codec
from unstall.cache.points.decoded import DecodedCache, PrefixOf, Split, loader_verdict
from unstall.cache.points.fingerprint import preparation_fingerprint
from unstall.cache.points.samples import (
    Refused,
    announce,
    bind_segment,
    paths_digest,
    refusal,
)

#: Samples timed to measure the costs (spread over the dataset).
MEASURED = 8
#: Shares of decoded samples the plan tries.
GRID = 64


@dataclass(frozen=True)
class Plan:
    """Which samples are decoded, which held as bytes, and what each part is given."""

    decoded: np.ndarray  # bool per sample
    as_bytes: np.ndarray  # bool per sample
    decoded_bytes: int
    file_bytes: int
    saved_s: float  # CPU seconds saved per epoch, by the measurement
    bytes_only_saved_s: float  # the same for a byte cache of the same size
    costs: dict[str, float]


def measure(split: Split, picks: list[int]) -> dict[str, float]:
    """Median CPU seconds to read a file and to run the prefix, and mean bytes of both."""
    read_s, head_s, file_b, head_b = [], [], [], []
    for i in picks:
        path = split.paths[i]
        t0 = time.thread_time()  # CPU seconds: what the cache saves the workers' cores
        raw = _read(path)  # not through an open hook: the file itself
        t1 = time.thread_time()
        image = split.head(path)
        t2 = time.thread_time()
        read_s.append(t1 - t0)
        head_s.append(t2 - t1)
        file_b.append(len(raw))
        head_b.append(len(codec.encode(image)))
    return {
        "read_s": float(np.median(read_s)),
        "prefix_s": float(np.median(head_s)),
        "file_bytes": float(np.mean(file_b)),
        "decoded_bytes": float(np.mean(head_b)),
        "decoded_spread": float(np.std(head_b) / max(np.mean(head_b), 1.0)),
    }


def plan(file_sizes: np.ndarray, costs: dict[str, float], budget: int) -> Plan:
    """The placement saving the most CPU per epoch under ``budget`` bytes (module notes)."""
    n = len(file_sizes)
    if costs["decoded_spread"] < 0.05:  # one size (a crop): every entry is that size
        decoded = np.full(n, costs["decoded_bytes"])
    else:
        decoded = file_sizes * (costs["decoded_bytes"] / max(costs["file_bytes"], 1.0))
    decoded = decoded + 256  # the entry's header
    mean_file = max(float(file_sizes.mean()), 1.0)
    gain_d = (costs["read_s"] + costs["prefix_s"]) * decoded / float(decoded.mean())
    gain_b = costs["read_s"] * file_sizes / mean_file
    order = np.argsort(decoded, kind="stable")
    cum_d = np.concatenate([[0.0], np.cumsum(decoded[order])])
    cum_gd = np.concatenate([[0.0], np.cumsum(gain_d[order])])
    best: tuple[float, int, np.ndarray] | None = None
    bytes_only = 0.0
    for k in sorted({round(n * j / GRID) for j in range(GRID + 1)}):
        left = budget - cum_d[k]
        if left < 0:
            break
        rest = order[k:]
        by_size = rest[np.argsort(file_sizes[rest], kind="stable")]
        fits = by_size[: int(np.searchsorted(np.cumsum(file_sizes[by_size]), left, "right"))]
        saved = float(cum_gd[k] + gain_b[fits].sum())
        if k == 0:
            bytes_only = saved
        if best is None or saved > best[0]:
            best = (saved, k, fits)
    assert best is not None  # k = 0 always fits
    saved, k, fits = best
    is_decoded = np.zeros(n, dtype=bool)
    is_decoded[order[:k]] = True
    as_bytes = np.zeros(n, dtype=bool)
    as_bytes[fits] = True
    return Plan(
        decoded=is_decoded,
        as_bytes=as_bytes,
        decoded_bytes=int(cum_d[k]),
        file_bytes=int(file_sizes[fits].sum()),
        saved_s=saved,
        bytes_only_saved_s=bytes_only,
        costs=costs,
    )


def bind_decoded(cache: Any, dataset: Any, split: Split, hold: str) -> DecodedCache:
    """``cache`` bound to ``dataset``'s prefix outputs: all of them (``decoded``) or as
    planned with the other samples' bytes (``auto``).

    Raises:
        Refused: the loader function is not deterministic (or opted out).
    """
    name = type(dataset).__name__
    n = len(split.paths)
    picks = sorted({round(j * (n - 1) / max(MEASURED - 1, 1)) for j in range(MEASURED)})
    verdict = loader_verdict(split, getattr(cache, "deterministic", None), picks[:3])
    if not verdict.ok:
        raise Refused({**verdict.as_stats(), "holds": "bytes"})
    costs = measure(split, picks)
    fingerprint = preparation_fingerprint(PrefixOf(split), "decoded", paths_digest(split.paths))
    where = "samples"
    args = dict(hold="decoded", where=where, dataset_name=name, verdict=verdict)
    if hold == "decoded":
        layer, per = bind_segment(cache, "decoded", fingerprint, n, costs["decoded_bytes"])
        bound = DecodedCache(layer, split, fingerprint=fingerprint, **args)
        announce(bound, f"{name}'s {n} images after {split.describe()}", per)
        return bound
    budget = int(cache.capacity) if isinstance(cache.capacity, int) else 0
    if budget <= 0:
        raise Refused(refusal("budget", "hold='auto' needs a RAM size in bytes"))
    sizes = np.array([os.stat(p).st_size for p in split.paths], dtype=np.float64)
    chosen = plan(sizes, costs, budget)
    layer = None
    if chosen.decoded.any():
        room = int(chosen.decoded_bytes * 1.02) + (1 << 20)
        layer, per = bind_segment(
            cache, "decoded", fingerprint, n, costs["decoded_bytes"], capacity=room
        )
    else:
        layer, per = _NoTier(), 0
    bound = DecodedCache(
        layer, split, only=chosen.decoded.tolist(), fingerprint=fingerprint, **args
    )
    bound.hold = "auto"
    bound.plan = chosen
    if chosen.as_bytes.any():
        bound.files = _bind_bytes(
            cache,
            [split.paths[i] for i in np.flatnonzero(chosen.as_bytes)],
            chosen.file_bytes,
            name,
        )
    announce(
        bound,
        f"{name}: {int(chosen.decoded.sum())} of {n} images after {split.describe()} and "
        f"{int(chosen.as_bytes.sum())} files' bytes (saves {chosen.saved_s:.1f} CPU s an "
        f"epoch by measure; bytes alone {chosen.bytes_only_saved_s:.1f} s)",
        per,
    )
    return bound


def _bind_bytes(cache: Any, paths: list[str], size: int, name: str) -> FileCache:
    """A byte cache of ``paths``' whole files, sized for them."""
    from unstall.cache.cache import Cache

    listing = FileListing(paths)
    sized = Cache(int(size * 1.02) + (1 << 20), keep=cache.keep, name=cache.name)
    layer = sized.bind(listing, peers=None)
    cache.track(layer)  # the user's cache leaves it on close
    return FileCache(layer, listing, "samples (planned)", name)


def _read(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class _NoTier:
    """The decoded part of a plan that decodes nothing: no segment."""

    def __init__(self) -> None:
        self.tiers: list[Any] = []
        self.ram = None
        self.bound_ns = 0

    def stats(self) -> dict[str, Any]:
        return {"cache": {"enabled": False, "hits": 0, "misses": 0, "inserted_bytes": 0}}

    def check(self) -> None:
        return None

    def close(self) -> bool:
        return False
