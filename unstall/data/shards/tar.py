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
from unstall.data.shards.index import ShardInfo, ShardTable, index_file, load, save
from unstall.data.shards.tar_scan import LABEL_BYTES, TarScan
from unstall.errors import SampleError

SUFFIXES = (".tar",)
#: ``direct_labels`` value of a sample with no image field (`ShardDataset.prepare` names it)
NO_IMAGE = -2
_KEY_EXT = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")


class ShardFormatError(SampleError):
    """A shard is truncated or corrupt: the message names the shard and the member."""


def index_tar(path: str, shard: str, scan: TarScan | None = None) -> ShardTable:
    """The samples of the tar file at ``path`` (named ``shard`` in messages); ``scan``: its
    headers read as its bytes streamed in (`TarScan`), used when it read the shard cleanly."""
    scanned = scan.result() if scan is not None else None
    if scanned is not None:
        members, _end, values = scanned
        read: Any = lambda offset, n: values.get(offset, b"")  # noqa: E731
    else:
        size = os.path.getsize(path)
        try:
            members, end = _members_fast(path, shard, size)
        except _Unusual:  # pax or GNU long-name headers, base-256 sizes: `tarfile` reads them
            members, end = _members_tarfile(path, shard, size)
        last = members[-1][0] if members else "(the first member)"
        _check_tail(path, shard, size, end, last)
        read = _pread(path)
    keys: list[str] = []
    spans: list[tuple[int, int]] = []
    first = [0]
    fields: dict[str, int] = {}
    m_field: list[int] = []
    m_off: list[int] = []
    m_size: list[int] = []
    current: str | None = None
    seen: set[str] = set()
    for name, offset, n in members:
        match = _KEY_EXT.match(name)
        if match is None or name.rsplit("/", 1)[-1].startswith("__"):
            continue  # no extension: webdataset skips such members too
        key, ext = match.group(1), match.group(2).lower()
        if key != current:
            if current is not None:
                first.append(len(m_off))
            current, seen = key, set()
            keys.append(key)
            spans.append((offset, offset + n))
        elif ext in seen:
            raise ShardFormatError(
                f"tar shard {shard!r}: sample {key!r} has field {ext!r} twice (member {name!r})",
                key=f"{shard}:{name}",
            )
        seen.add(ext)
        start = spans[-1][0]
        spans[-1] = (start, offset + n)
        m_field.append(fields.setdefault(ext, len(fields)))
        m_off.append(offset - start)
        m_size.append(n)
    if current is not None:
        first.append(len(m_off))
    return ShardTable(
        extra={"cls": _labels(read, fields.get("cls"), first, m_field, m_off, m_size, spans)},
        keys=keys,
        spans=np.array(spans, dtype=np.int64).reshape(-1, 2),
        fields=list(fields),
        first=np.array(first, dtype=np.int64),
        member_field=np.array(m_field, dtype=np.int16),
        member_off=np.array(m_off, dtype=np.int64),
        member_size=np.array(m_size, dtype=np.int64),
    )


def _pread(path: str) -> Any:
    """``read(offset, n)`` of the file at ``path``."""

    def read(offset: int, n: int) -> bytes:
        with open(path, "rb") as f:
            return os.pread(f.fileno(), n, offset)

    return read


def _labels(
    read: Any,
    cls: int | None,
    first: list[int],
    m_field: list[int],
    m_off: list[int],
    m_size: list[int],
    spans: list[tuple[int, int]],
) -> np.ndarray:
    """Each sample's ``.cls`` value (-1 where missing or not a non-negative integer), read
    while indexing (``read(offset, n)``), so a sample's label needs no bytes of the sample."""
    out = np.full(len(spans), -1, dtype=np.int64)
    if cls is None:
        return out
    for s in range(len(spans)):
        for m in range(first[s], first[s + 1]):
            if m_field[m] == cls and m_size[m] <= LABEL_BYTES:
                text = read(spans[s][0] + m_off[m], m_size[m]).strip()
                if text.isdigit():
                    out[s] = int(text)
    return out


class _Unusual(Exception):
    """A header the fast reader leaves to `tarfile` (pax, GNU long names, base-256 sizes)."""


def _truncated(shard: str, name: str, start: int, n: int, size: int) -> ShardFormatError:
    return ShardFormatError(
        f"tar shard {shard!r} is truncated: member {name!r} needs bytes {start}..{start + n} "
        f"of a {size}-byte file",
        key=f"{shard}:{name}",
    )


def _members_fast(path: str, shard: str, size: int) -> tuple[list[tuple[str, int, int]], int]:
    """(name, data offset, size) of each regular file, and where the members end, reading
    only the 512-byte ustar headers (about 10x faster than `tarfile` per member)."""
    members: list[tuple[str, int, int]] = []
    pos = end = 0
    last = "(the first member)"
    with open(path, "rb") as f:
        while pos + 512 <= size:
            f.seek(pos)
            header = f.read(512)
            if header == _ZERO_BLOCK:
                break
            if header[257:262] != b"ustar" or header[156:157] in b"xgLKS" or header[124] & 0x80:
                raise _Unusual
            try:
                checksum = int(header[148:156].split(b"\0", 1)[0].strip() or b"0", 8)
                n = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
            except ValueError:
                checksum, n = -1, 0
            if checksum != sum(header) - sum(header[148:156]) + 256:
                raise ShardFormatError(
                    f"tar shard {shard!r} is corrupt or truncated after member {last!r}: "
                    f"bad header checksum at byte {pos}",
                    key=f"{shard}:{last}",
                )
            name = header[0:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            prefix = header[345:500].split(b"\0", 1)[0]
            if prefix:
                name = prefix.decode("utf-8", "surrogateescape") + "/" + name
            start = pos + 512
            if start + n > size:
                raise _truncated(shard, name, start, n, size)
            if header[156:157] in (b"0", b"\0", b"7"):
                members.append((name, start, n))
            last = name
            end = start + n
            pos = start + n + (-n % 512)
    return members, end


_ZERO_BLOCK = bytes(512)


def _members_tarfile(path: str, shard: str, size: int) -> tuple[list[tuple[str, int, int]], int]:
    """The same as `_members_fast`, through Python's `tarfile` (every header kind)."""
    members: list[tuple[str, int, int]] = []
    last = "(the first member)"
    end = 0
    try:
        with tarfile.open(path, mode="r:") as tf:
            for info in tf:
                if info.offset_data + info.size > size:
                    raise _truncated(shard, info.name, info.offset_data, info.size, size)
                end, last = info.offset_data + info.size, info.name
                if info.isfile():
                    members.append((info.name, info.offset_data, info.size))
    except tarfile.TarError as exc:
        raise ShardFormatError(
            f"tar shard {shard!r} is corrupt or truncated after member {last!r}: {exc}",
            key=f"{shard}:{last}",
        ) from exc
    return members, end


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


class IndexThen:
    """``then(path, key)`` of a download: index the tar shard at ``path`` and save its table
    at once (picklable: it runs where the store downloads, e.g. its helper process)."""

    def __init__(self, directory: str, infos: dict[str, ShardInfo], *, remove: bool = False):
        self.directory, self.infos, self.remove = directory, infos, remove

    def scanner(self, key: str, size: int) -> TarScan | None:
        """What the download of ``key`` feeds its bytes to as they stream in (None when its
        index is stored already): the shard is indexed when its last byte lands."""
        info = self.infos.get(key)
        if info is None or os.path.exists(index_file(self.directory, info)):
            return None
        return TarScan(size)

    def __call__(self, path: str, key: str, scan: TarScan | None = None) -> ShardTable:
        info = self.infos[key]
        table = load(self.directory, info)
        if table is None:
            table = index_tar(path, key, scan)
            save(self.directory, info, table)
        if self.remove:
            os.unlink(path)
        return table


class TarShards(ShardDataset):
    """WebDataset ``.tar`` shards, read in place, by sample index (see `ShardDataset`).

    Default fields: the image from ``jpg``/``jpeg``/``png``/``webp``, the label from
    ``cls``. On S3 the index comes from the first full read of each shard (its headers
    parsed as its bytes stream in, `TarScan`), which is also the download that serves the
    epochs from local disk; with no index stored, the shards land in the background after
    the first, and the length is known once they have (`growing`).
    """

    kind = "tar"
    suffixes = SUFFIXES
    lazy_index = True  # a tar's index is its headers, through the whole shard: built as it lands

    def on_landing(self, infos: list[ShardInfo], directory: str) -> Any:
        return IndexThen(directory, {i.key: i for i in infos})

    def build_index(self, infos: list[ShardInfo], directory: str) -> list[ShardTable]:
        if not self.location.remote:
            return [index_tar(self.location.path(i.key), i.key) for i in infos]
        assert self.files is not None
        by_key = {i.key: i for i in infos}
        if self.keep:
            # each shard indexed, and its index saved, as soon as it is complete, while the
            # others still arrive: a survey stopped part way resumes where it stopped
            done = self.files.ensure(self.location, infos, then=IndexThen(directory, by_key))
            return [done[i.key] for i in infos]
        # not kept: each shard through a temporary file, indexed (and saved) and deleted
        import tempfile

        with tempfile.TemporaryDirectory(dir=self.files.dir) as tmp:
            items = [(info, os.path.join(tmp, f"{n}")) for n, info in enumerate(infos)]
            then = IndexThen(directory, by_key, remove=True)
            return self.location.download(items, then)

    def direct_spans(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Image-only spans when every sample has an image field and the label is ``cls``
        (or none): the image is then read alone and handed on without a copy."""
        if self.image is None or self.label not in (None, "cls"):
            return super().direct_spans()
        ids = {name: i for i, name in enumerate(self.index.fields)}
        ranked = [ids[n] for n in self.image.split(";") if n in ids]
        if not ranked or len(self.index) == 0:
            return super().direct_spans()
        idx = self.index
        rank = np.full(max(ids.values()) + 1, len(ranked), dtype=np.int64)
        rank[ranked] = np.arange(len(ranked))
        member_rank = rank[idx.member_field.astype(np.int64)]
        owner = np.repeat(np.arange(len(idx)), np.diff(idx.first))
        # per sample, the member with the best rank: sort by (sample, rank), take the first
        order = np.lexsort((member_rank, owner))
        firsts = order[np.searchsorted(owner[order], np.arange(len(idx)))]
        no_image = member_rank[firsts] >= len(ranked)
        if np.any(no_image) and not self.__dict__.get("direct"):  # a sample without an image
            return super().direct_spans()
        start = idx.spans[:, 0] + idx.member_off[firsts]
        spans = np.stack([start, start + idx.member_size[firsts]], axis=1)
        labels = idx.extra["cls"].copy()
        # shards indexed after the choice (`growing`): such a sample fails as it would have
        labels[no_image] = NO_IMAGE
        return spans, labels

    def wanted_fields(self, index: int, raw: bytes) -> dict[str, Any]:
        """Only the image and label members, sliced once (the other members are not copied)."""
        index_of, want = self.__dict__.get("_want_ids", (None, None))
        if index_of is not self.index or want is None:  # (the index grew since: `growing`)
            names = (self.image or "").split(";") + (self.label or "").split(";")
            ids = {name: i for i, name in enumerate(self.index.fields)}
            want = {ids[n]: n for n in names if n in ids}
            self._want_ids = (self.index, want)
        a, b = int(self.index.first[index]), int(self.index.first[index + 1])
        rows = self.index.member_rows[a:b].tolist()
        return {want[f]: raw[o : o + n] for f, o, n in rows if f in want}

    def fields(self, index: int, raw: bytes) -> dict[str, Any]:
        return {name: raw[a : a + n] for name, a, n in self.index.members(index)}
