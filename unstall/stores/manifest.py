"""Key listings cached on disk, so a restart does not list millions of objects again.

One text file per (URL, endpoint): a header line, then one object per line:
``key<TAB>size<TAB>etag<TAB>mtime_ns`` (v2; a v1 file has the key alone), so the
versions of the objects (`unstall.stores.listing`) are kept with the keys.
Directory: ``manifest_dir`` if given, else ``$UNSTALL_CACHE_DIR/manifests``, else
``~/.cache/unstall/manifests``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from unstall import machine

HEADER = "# unstall manifest v"


def manifest_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """Where manifests live (created on first write)."""
    if directory is not None:
        return Path(directory).expanduser()
    return Path(machine.cache_dir()) / "manifests"


def manifest_path(url: str, endpoint: str | None, directory: Path) -> Path:
    """The manifest file of ``url`` at ``endpoint``: a hash of both, so servers never mix."""
    digest = hashlib.blake2b(f"{url}\n{endpoint or ''}".encode(), digest_size=16).hexdigest()
    return directory / f"{digest}.txt"


def read_manifest(path: Path, url: str) -> list[str] | None:
    """The keys stored in ``path``, or None if it is missing or not a manifest of ``url``."""
    got = read_rows(path, url)
    if got is None:
        return None
    version, rows = got
    return rows if version == 1 else [row.rsplit("\t", 3)[0] for row in rows]


def read_entries(path: Path, url: str) -> list[tuple[str, int, str, int]] | None:
    """``(key, size, etag, mtime_ns)`` per object, or None (missing, another URL, or a v1
    manifest that has no sizes and ETags)."""
    got = read_rows(path, url)
    if got is None or got[0] == 1:
        return None
    out = []
    for row in got[1]:
        key, size, etag, mtime = row.rsplit("\t", 3)
        out.append((key, int(size), etag, int(mtime)))
    return out


def read_rows(path: Path, url: str) -> tuple[int, list[str]] | None:
    """``(format version, lines after the header)``, or None if missing, another URL's, or
    cut short."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    header, _, body = text.partition("\n")
    if not header.startswith(HEADER) or f" url={url} " not in header + " ":
        return None
    version = header[len(HEADER) :].split(" ", 1)[0]
    if version not in ("1", "2"):
        return None
    rows = body.split("\n")
    if rows and rows[-1] == "":
        rows.pop()
    count = header.rsplit(" count=", 1)[-1]
    if not count.isdigit() or int(count) != len(rows):
        return None  # truncated write: list again
    return int(version), rows


def write_manifest(
    path: Path, url: str, keys: list[str], entries: list[tuple[str, int, str, int]] | None = None
) -> None:
    """Write ``keys`` (v1) or ``entries`` (v2: with size, ETag, mtime) atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for key in keys if entries is None else [e[0] for e in entries]:
        if "\n" in key:
            raise ValueError(f"key {key!r} under {url} contains a newline; cannot be listed")
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    if entries is None:
        body, version, count = "".join(f"{k}\n" for k in keys), 1, len(keys)
    else:
        body = "".join(f"{k}\t{size}\t{etag}\t{mtime}\n" for k, size, etag, mtime in entries)
        version, count = 2, len(entries)
    tmp.write_text(f"{HEADER}{version} url={url} count={count}\n{body}", encoding="utf-8")
    os.replace(tmp, path)
