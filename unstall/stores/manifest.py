"""Key listings cached on disk, so a restart does not list millions of objects again.

One text file per (URL, endpoint): a header line, then one key per line.
Directory: ``manifest_dir`` if given, else ``$UNSTALL_CACHE_DIR/manifests``, else
``~/.cache/unstall/manifests``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

HEADER = "# unstall manifest v1"


def manifest_dir(directory: str | os.PathLike[str] | None = None) -> Path:
    """Where manifests live (created on first write)."""
    if directory is not None:
        return Path(directory).expanduser()
    base = os.environ.get("UNSTALL_CACHE_DIR")
    root = Path(base).expanduser() if base else Path("~/.cache/unstall").expanduser()
    return root / "manifests"


def manifest_path(url: str, endpoint: str | None, directory: Path) -> Path:
    """The manifest file of ``url`` at ``endpoint``: a hash of both, so servers never mix."""
    digest = hashlib.blake2b(f"{url}\n{endpoint or ''}".encode(), digest_size=16).hexdigest()
    return directory / f"{digest}.txt"


def read_manifest(path: Path, url: str) -> list[str] | None:
    """The keys stored in ``path``, or None if it is missing or not a manifest of ``url``."""
    try:
        text = path.read_text(encoding="utf-8")
    except (FileNotFoundError, NotADirectoryError):
        return None
    header, _, body = text.partition("\n")
    if not header.startswith(HEADER) or f" url={url} " not in header + " ":
        return None
    keys = body.split("\n")
    if keys and keys[-1] == "":
        keys.pop()
    count = header.rsplit(" count=", 1)[-1]
    if not count.isdigit() or int(count) != len(keys):
        return None  # truncated write: list again
    return keys


def write_manifest(path: Path, url: str, keys: list[str]) -> None:
    """Write ``keys`` atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for key in keys:
        if "\n" in key:
            raise ValueError(f"key {key!r} under {url} contains a newline; cannot be listed")
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    body = "".join(f"{k}\n" for k in keys)
    tmp.write_text(f"{HEADER} url={url} count={len(keys)}\n{body}", encoding="utf-8")
    os.replace(tmp, path)
