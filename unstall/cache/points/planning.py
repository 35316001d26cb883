"""Planning mixed placement (``hold="auto"``): the costs measured on the job's own samples,
and the placement that saves the most CPU per epoch under the RAM and disk budgets.

Each sample is held decoded, as its file's bytes, or not at all, in the RAM tier or in the
disk tier. What an entry saves, in CPU seconds per access (`measure`, on the job's own
samples):

- a decoded entry in RAM saves reading the file and running the prefix (decode,
  resize...), less reading it back into an image (``back_s``: the entry decoded from
  memory); on disk, less also reading its bytes back from the disk tier's file
  (``disk_s_per_byte``, measured with ``pread`` as the disk tier reads, in the disk tier's
  own directory);
- a byte entry in RAM saves reading the file; on disk, less reading its bytes back.

Per-sample sizes are the files' (``stat``) and, for decoded entries, the file's size times
the measured ratio of decoded to file bytes (the measured size when the prefix gives one
size, as ``CenterCrop`` does). `plan` tries every share of decoded samples in RAM (the
smallest first: the most samples per byte) on a grid; for each, every share of the others
decoded on disk; then the remaining samples' files fill the RAM left, and the disk left
where reading them back from it saves anything. It takes the placement saving the most.
The byte cache of the same RAM and disk sizes (files filling RAM, then disk) is one of the
placements it weighs, so a mixed cache never saves less than it by its own measure.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from unstall.cache.points import codec

#: Samples timed to measure the costs (spread over the dataset).
MEASURED = 8
#: Shares of decoded samples in RAM the plan tries.
GRID = 64
#: Shares of the remaining samples decoded on disk it tries, for each of those.
DISK_GRID = 16
#: Bytes a decoded entry carries besides its pixels (the codec's header).
HEADER = 256


@dataclass(frozen=True)
class Plan:
    """Which samples are decoded, which held as bytes, in which tier, and what each takes."""

    decoded: np.ndarray  # bool per sample: held decoded (in RAM or on disk)
    as_bytes: np.ndarray  # bool per sample: its file's bytes held (in RAM or on disk)
    on_disk: np.ndarray  # bool per sample: its entry (decoded or bytes) is in the disk tier
    decoded_bytes: int  # decoded entries' bytes in RAM
    file_bytes: int  # byte entries' bytes in RAM
    disk_decoded_bytes: int
    disk_file_bytes: int
    saved_s: float  # CPU seconds saved per epoch, by the measurement
    bytes_only_saved_s: float  # the same for a byte cache of the same RAM and disk sizes
    ram_only_saved_s: float  # the best placement with the RAM budget alone (no disk tier)
    costs: dict[str, float]


def measure(
    head: Any, paths: list[str], picks: list[int], disk_dir: str | None = None
) -> dict[str, float]:
    """Median CPU seconds to read a file, run the prefix (``head(path)``) and read a decoded
    entry back; mean bytes of both; with ``disk_dir``, the CPU seconds per byte of reading
    entries back with ``pread`` from a file there (removed before returning)."""
    read_s, head_s, back_s, file_b, head_b, encoded = [], [], [], [], [], []
    for i in picks:
        path = paths[i]
        t0 = time.thread_time()  # CPU seconds: what the cache saves the workers' cores
        raw = read_file(path)  # not through an open hook: the file itself
        t1 = time.thread_time()
        image = head(path)
        t2 = time.thread_time()
        entry = codec.encode(image)
        t3 = time.thread_time()
        codec.decode(entry)
        back_s.append(time.thread_time() - t3)
        read_s.append(t1 - t0)
        head_s.append(t2 - t1)
        file_b.append(len(raw))
        head_b.append(len(entry))
        encoded.append(entry)
    out = {
        "read_s": float(np.median(read_s)),
        "prefix_s": float(np.median(head_s)),
        "back_s": float(np.median(back_s)),
        "file_bytes": float(np.mean(file_b)),
        "decoded_bytes": float(np.mean(head_b)),
        "decoded_spread": float(np.std(head_b) / max(np.mean(head_b), 1.0)),
    }
    if disk_dir is not None:
        out["disk_s_per_byte"] = _disk_read_cost(disk_dir, encoded)
    return out


def _disk_read_cost(directory: str, entries: list[bytes]) -> float:
    """CPU seconds per byte of reading ``entries`` back with ``pread`` from one file in
    ``directory``, as the disk tier reads its data file (median over the entries)."""
    os.makedirs(directory, exist_ok=True)
    fd, path = tempfile.mkstemp(prefix=".measure-", dir=directory)
    try:
        offsets = []
        for entry in entries:
            offsets.append(os.lseek(fd, 0, os.SEEK_CUR))
            os.write(fd, entry)
        per_byte = []
        for entry, offset in zip(entries, offsets, strict=True):
            t0 = time.thread_time()
            got = os.pread(fd, len(entry), offset)
            per_byte.append((time.thread_time() - t0) / max(len(got), 1))
        return float(np.median(per_byte))
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def plan(file_sizes: np.ndarray, costs: dict[str, float], budget: int, disk: int = 0) -> Plan:
    """The placement saving the most CPU per epoch under ``budget`` bytes of RAM and
    ``disk`` bytes of disk (module notes)."""
    n = len(file_sizes)
    files = np.asarray(file_sizes, dtype=np.float64)
    if costs["decoded_spread"] < 0.05:  # one size (a crop): every entry is that size
        decoded = np.full(n, costs["decoded_bytes"])
    else:
        decoded = files * (costs["decoded_bytes"] / max(costs["file_bytes"], 1.0))
    decoded = decoded + HEADER
    saves = costs["read_s"] + costs["prefix_s"] - costs.get("back_s", 0.0)
    gain_d = saves * decoded / float(decoded.mean())
    gain_b = costs["read_s"] * files / max(float(files.mean()), 1.0)
    per_byte = costs.get("disk_s_per_byte", 0.0)
    gains = (gain_b, gain_d - per_byte * decoded, gain_b - per_byte * files)
    order = np.argsort(decoded, kind="stable")
    by_size = np.argsort(files, kind="stable")
    cum_d = np.concatenate([[0.0], np.cumsum(decoded[order])])
    cum_gd = np.concatenate([[0.0], np.cumsum(gain_d[order])])
    best: tuple[float, int, tuple[np.ndarray, ...]] | None = None
    ram_only, bytes_only = 0.0, None
    for k in _shares(n, GRID, cum_d, budget):
        rest = np.ones(n, dtype=bool)
        rest[order[:k]] = False
        room = budget - cum_d[k]
        in_ram = _fill(by_size[rest[by_size]], files, room)
        ram_only = max(ram_only, float(cum_gd[k] + gain_b[in_ram].sum()))
        for saved, parts in _with_disk(rest, order, by_size, decoded, files, room, disk, gains):
            if bytes_only is None:  # the first: the byte cache, files in RAM, then on disk
                bytes_only = saved
            if best is None or cum_gd[k] + saved > best[0]:
                best = (float(cum_gd[k] + saved), k, parts)
    assert best is not None  # k = 0 always fits
    saved, k, (disk_decoded, ram_bytes, disk_bytes) = best
    is_decoded = np.zeros(n, dtype=bool)
    is_decoded[order[:k]] = True
    is_decoded[disk_decoded] = True
    as_bytes = np.zeros(n, dtype=bool)
    as_bytes[ram_bytes] = True
    as_bytes[disk_bytes] = True
    on_disk = np.zeros(n, dtype=bool)
    on_disk[disk_decoded] = True
    on_disk[disk_bytes] = True
    return Plan(
        decoded=is_decoded,
        as_bytes=as_bytes,
        on_disk=on_disk,
        decoded_bytes=int(cum_d[k]),
        file_bytes=int(files[ram_bytes].sum()),
        disk_decoded_bytes=int(decoded[disk_decoded].sum()),
        disk_file_bytes=int(files[disk_bytes].sum()),
        saved_s=saved,
        bytes_only_saved_s=float(bytes_only or 0.0),
        ram_only_saved_s=ram_only,
        costs=costs,
    )


def _with_disk(
    rest: np.ndarray,
    order: np.ndarray,
    by_size: np.ndarray,
    decoded: np.ndarray,
    files: np.ndarray,
    room: float,
    disk: int,
    gains: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> Iterator[tuple[float, tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    """For the samples ``rest`` (a bool mask: not decoded in RAM), with ``room`` bytes of RAM
    left and ``disk`` bytes of disk: each placement tried, as (CPU seconds saved, (decoded
    on disk, bytes in RAM, bytes on disk)). A share of them decoded on disk (the smallest
    first), then the others' files fill the RAM left, then the disk left. The first has
    none decoded on disk and every file that fits on disk: the byte cache's own fill."""
    gain_b, disk_d, disk_b = gains
    left = order[rest[order]]  # the remaining samples, the smallest decoded first
    cum = np.concatenate([[0.0], np.cumsum(decoded[left])])
    cum_g = np.concatenate([[0.0], np.cumsum(disk_d[left])])
    pays = disk > 0 and disk_d[left].sum() > 0
    for k in _shares(len(left), DISK_GRID, cum, disk) if pays else [0]:
        others = rest.copy()
        others[left[:k]] = False
        in_ram = _fill(by_size[others[by_size]], files, room)
        others[in_ram] = False
        worth = by_size[others[by_size]]
        saved = float(cum_g[k] + gain_b[in_ram].sum())
        if k == 0:  # the byte cache's fill, every file that fits, saving or not
            spill = _fill(worth, files, disk)
            yield saved + float(disk_b[spill].sum()), (left[:0], in_ram, spill)
        worth = worth[disk_b[worth] > 0]  # bytes read back from disk may save nothing
        spill = _fill(worth, files, disk - cum[k])
        yield saved + float(disk_b[spill].sum()), (left[:k], in_ram, spill)


def _shares(n: int, grid: int, cum: np.ndarray, budget: float) -> list[int]:
    """The counts of entries tried: a grid over ``0..n`` up to what ``budget`` holds, and
    the most it holds (``cum``: the entries' cumulative bytes)."""
    most = max(int(np.searchsorted(cum, budget, "right")) - 1, 0)
    tried = {round(n * j / grid) for j in range(grid + 1)}
    return sorted({k for k in tried if k < most} | {most})


def _fill(candidates: np.ndarray, sizes: np.ndarray, room: float) -> np.ndarray:
    """The first ``candidates`` whose sizes fit in ``room`` bytes together."""
    if room <= 0:
        return candidates[:0]
    return candidates[: int(np.searchsorted(np.cumsum(sizes[candidates]), room, "right"))]


def read_file(path: str) -> bytes:
    """A file's bytes, read with ``os.read`` (no Python ``open``: no open hook sees it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
