"""The index of a local image folder (keys, labels, classes), listed once and kept on disk.

Building `ImageFolder` over a million local files used to walk the tree with
``os.walk`` (a ``relpath`` per file), filter and sort Python strings and encode
them again, in every process and rank: 1.5 s and a 250 MB peak each time. Here
one ``os.scandir`` pass per directory lists the names, and the result is saved in
``$UNSTALL_CACHE_DIR/listings`` with every directory's mtime; the next
construction checks those mtimes (one ``stat`` per directory) and loads the
arrays as they are. A file created, removed or renamed changes its directory's
mtime, so the saved names stay right; a file rewritten in place does not, which
is fine here: names are all this index holds (versions are taken separately, see
`FileDataset.versions`). A listing whose directories changed less than
`SETTLE_S` before it was made is not saved (file-system timestamps are coarse).
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import os
import time
from pathlib import Path

import numpy as np

from unstall import machine
from unstall.data.keys import KeyTable
from unstall.data.npz import read_npz

#: A directory modified this recently (seconds) may still change within one timestamp tick.
SETTLE_S = 2.0
_FORMAT = 1


def listings_dir() -> Path:
    """``$UNSTALL_CACHE_DIR/listings`` (default ``~/.cache/unstall/listings``)."""
    return Path(machine.cache_dir()) / "listings"


def folder_index(root: Path, extensions: tuple[str, ...]) -> tuple[KeyTable, np.ndarray, list[str]]:
    """``(keys, labels, classes)`` of the images under ``root/<class>/...``: keys sorted,
    labels the index of each key's top folder in the sorted class names."""
    path = listings_dir() / (
        hashlib.blake2b(f"{root}\n{extensions}\n{_FORMAT}".encode(), digest_size=16).hexdigest()
        + ".npz"
    )
    saved = _load(path, root)
    if saved is not None:
        return saved
    started = time.time_ns()
    keys, dirs, mtimes = _scan(root, extensions)
    keys.sort()
    classes = sorted({k[: k.index("/")] for k in _firsts(keys)})
    labels = np.empty(len(keys), dtype=np.int64)
    for label, name in enumerate(classes):  # a class's keys share a prefix: one range
        lo = bisect.bisect_left(keys, name + "/")
        hi = bisect.bisect_left(keys, name + "0")  # "0" follows "/"
        labels[lo:hi] = label
    table = KeyTable(keys)
    del keys
    if mtimes.size and int(mtimes.max()) < started - int(SETTLE_S * 1e9):
        _save(path, table, labels, classes, dirs, mtimes)
    return table, labels, classes


def _firsts(keys: list[str]) -> list[str]:
    """One key per top folder (keys sorted, so a folder's keys are contiguous)."""
    out, last = [], None
    for key in keys:
        head = key[: key.index("/")]
        if head != last:
            out.append(key)
            last = head
    return out


def _scan(root: Path, extensions: tuple[str, ...]) -> tuple[list[str], list[str], np.ndarray]:
    """Image keys at depth >= 1, and every directory visited with its mtime (taken first)."""
    keys: list[str] = []
    dirs: list[str] = []
    mtimes: list[int] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        where = os.path.join(root, rel) if rel else str(root)
        try:
            mtime = os.stat(where).st_mtime_ns
            it = os.scandir(where)
        except (FileNotFoundError, NotADirectoryError):
            continue
        dirs.append(rel)
        mtimes.append(mtime)
        head = f"{rel}/" if rel else ""
        with it:
            for entry in it:
                name = entry.name
                if entry.is_dir():
                    if not entry.is_symlink():  # as os.walk: a linked folder is not entered
                        stack.append(head + name)
                elif rel and name.lower().endswith(extensions):
                    keys.append(head + name)
    return keys, dirs, np.array(mtimes, dtype=np.int64)


def _save(
    path: Path,
    table: KeyTable,
    labels: np.ndarray,
    classes: list[str],
    dirs: list[str],
    mtimes: np.ndarray,
) -> None:
    blob, offsets = table.arrays()
    with contextlib.suppress(OSError):  # a read-only cache directory: list again next time
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
        np.savez(
            tmp,
            blob=np.frombuffer(blob, dtype=np.uint8),
            offsets=offsets,
            labels=labels,
            classes=np.array(classes, dtype=object).astype(str),
            dirs=np.array(dirs, dtype=object).astype(str),
            mtimes=mtimes,
        )
        os.replace(tmp, path)


def _load(path: Path, root: Path) -> tuple[KeyTable, np.ndarray, list[str]] | None:
    """The saved index if every directory still has the mtime it had; else None."""
    try:
        saved = read_npz(path)
        dirs, mtimes = saved["dirs"].tolist(), saved["mtimes"]
        for rel, mtime in zip(dirs, mtimes.tolist(), strict=True):
            if os.stat(os.path.join(root, rel) if rel else root).st_mtime_ns != mtime:
                return None
        table = KeyTable.from_arrays(saved["blob"].tobytes(), saved["offsets"])
        return table, saved["labels"], saved["classes"].tolist()
    except (OSError, ValueError, KeyError):
        return None
