"""WebDataset tar shards: members grouped into samples by key prefix, indexed by offset.

A sample is the run of consecutive members sharing a key: the path up to the
first dot of the file name (``dir/000042.jpg`` and ``dir/000042.cls`` are
sample ``dir/000042`` with fields ``jpg`` and ``cls``), as `webdataset` groups
them. Its members lie next to each other, so a sample is one byte span of the
shard (data of the first member to the end of the last; the tar headers between
them come along) and one read.
"""

from __future__ import annotations

import os
import re
import tarfile
from typing import Any

import numpy as np

from unstall.data.shards.dataset import ShardDataset
from unstall.data.shards.index import ShardInfo, ShardTable
from unstall.errors import SampleError

SUFFIXES = (".tar",)
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")


class ShardFormatError(SampleError):
    """A shard is truncated or corrupt: the message names the shard and the member."""


def index_tar(path: str, shard: str) -> ShardTable:
    """The samples of the tar file at ``path`` (named ``shard`` in messages)."""
    size = os.path.getsize(path)
    keys: list[str] = []
    spans: list[tuple[int, int]] = []
    first = [0]
    fields: dict[str, int] = {}
    m_field: list[int] = []
    m_off: list[int] = []
    m_size: list[int] = []
    current: str | None = None
    seen: set[str] = set()
    last = "(the first member)"
    end_of_members = 0
    try:
        with tarfile.open(path, mode="r:") as tf:
            for info in tf:
                if info.offset_data + info.size > size:
                    raise ShardFormatError(
                        f"tar shard {shard!r} is truncated: member {info.name!r} needs bytes "
                        f"{info.offset_data}..{info.offset_data + info.size} of a "
                        f"{size}-byte file",
                        key=f"{shard}:{info.name}",
                    )
                end_of_members = info.offset_data + info.size
                last = info.name
                if not info.isfile():
                    continue
                match = _KEY_EXT.match(info.name)
                if match is None or info.name.rsplit("/", 1)[-1].startswith("__"):
                    continue  # no extension: webdataset skips such members too
                key, ext = match.group(1), match.group(2).lower()
                if key != current:
                    if current is not None:
                        first.append(len(m_off))
                    current, seen = key, set()
                    keys.append(key)
                    spans.append((info.offset_data, info.offset_data + info.size))
                elif ext in seen:
                    raise ShardFormatError(
                        f"tar shard {shard!r}: sample {key!r} has field {ext!r} twice "
                        f"(member {info.name!r})",
                        key=f"{shard}:{info.name}",
                    )
                seen.add(ext)
                start = spans[-1][0]
                spans[-1] = (start, info.offset_data + info.size)
                m_field.append(fields.setdefault(ext, len(fields)))
                m_off.append(info.offset_data - start)
                m_size.append(info.size)
    except tarfile.TarError as exc:
        raise ShardFormatError(
            f"tar shard {shard!r} is corrupt or truncated after member {last!r}: {exc}",
            key=f"{shard}:{last}",
        ) from exc
    _check_tail(path, shard, size, end_of_members, last)
    if current is not None:
        first.append(len(m_off))
    return ShardTable(
        keys=keys,
        spans=np.array(spans, dtype=np.int64).reshape(-1, 2),
        fields=list(fields),
        first=np.array(first, dtype=np.int64),
        member_field=np.array(m_field, dtype=np.int16),
        member_off=np.array(m_off, dtype=np.int64),
        member_size=np.array(m_size, dtype=np.int64),
    )


def _check_tail(path: str, shard: str, size: int, end: int, last: str) -> None:
    """After the last member only zero blocks may follow: anything else is a cut header.

    Python's `tarfile` stops silently at a truncated or corrupt header past the
    first member, which would drop the rest of the shard without a word.
    """
    pad = -end % 512
    with open(path, "rb") as f:
        f.seek(end + pad)
        tail = f.read(1 << 20)
    if tail.strip(b"\0"):
        raise ShardFormatError(
            f"tar shard {shard!r} is truncated or corrupt after member {last!r}: "
            f"{size - end - pad} bytes follow it that are not a valid tar header",
            key=f"{shard}:{last}",
        )


class TarShards(ShardDataset):
    """WebDataset ``.tar`` shards, read in place, by sample index (see `ShardDataset`).

    Default fields: the image from ``jpg``/``jpeg``/``png``/``webp``, the label from
    ``cls``. On S3 the index comes from the first full read of each shard, which is
    also the download that serves epoch 1 from local disk.
    """

    kind = "tar"
    suffixes = SUFFIXES

    def _build(self, infos: list[ShardInfo]) -> list[ShardTable]:
        if self.location.remote and not self.keep:
            return [self._index_streamed(info) for info in infos]
        paths = self._local_copies(infos)
        return [index_tar(p, i.key) for p, i in zip(paths, infos, strict=True)]

    def _index_streamed(self, info: ShardInfo) -> ShardTable:
        """Index a shard that will not be kept: download to a temporary file, index, delete."""
        import tempfile

        assert self.files is not None
        with tempfile.TemporaryDirectory(dir=self.files.dir) as tmp:
            path = os.path.join(tmp, "shard")
            self.location.download([(info, path)])
            return index_tar(path, info.key)

    def fields(self, index: int, raw: bytes) -> dict[str, Any]:
        return {name: raw[a : a + n] for name, a, n in self.index.members(index)}
