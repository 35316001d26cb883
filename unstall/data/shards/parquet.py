"""Parquet files read in place: a sample is a row, read by row group with pyarrow.

The index is each file's footer: row groups, their row counts and the byte
range of their column chunks. ``fetch`` groups a batch's rows by row group,
decodes each needed row group once (a few are kept per process, so the next
batches of a window shuffle reuse them) and hands each row on as a small record
of the wanted columns. Remote files are read from local copies (the default,
as for tars) or, when they do not fit the disk budget, one ranged GET per row
group with the footer from the index. Hugging Face image columns (a struct of
``bytes`` and ``path``) give their bytes.
"""

from __future__ import annotations

import io
import json
import os
import struct
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from unstall.data.shards.dataset import ShardDataset
from unstall.data.shards.index import ShardInfo, ShardTable
from unstall.data.shards.tar import ShardFormatError
from unstall.errors import SampleError

#: Decoded row groups kept per process.
KEEP_ROW_GROUPS = 4


class ParquetShards(ShardDataset):
    """Parquet files (``s3://b/train-{00000..00099}.parquet``, a directory or a list), by row.

    Default fields: the image from column ``image`` (or ``jpg``/``img``), the label from
    ``label`` (or ``cls``). See `ShardDataset` for the other arguments.
    """

    kind = "parquet"
    suffixes = (".parquet",)
    default_image = "image;jpg;img"
    default_label = "label;cls"

    def build_index(self, infos: list[ShardInfo], directory: str) -> list[ShardTable]:
        import pyarrow.parquet as pq

        tables = []
        if self.location.remote:  # every file's tail in one call, all in flight
            self._tails = self._read_tails(infos)
        for info in infos:
            try:
                if self.location.remote:
                    meta = pq.read_metadata(io.BytesIO(self._footer(info)))
                else:
                    meta = pq.read_metadata(self.location.path(info.key))
            except Exception as exc:
                raise ShardFormatError(
                    f"Parquet file {info.key!r} under {self.location.url!r} has no readable "
                    f"footer: {type(exc).__name__}: {exc}"
                ) from exc
            keys, spans, rgs, rows = [], [], [], []
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                lo, hi = info.size, 0
                for c in range(rg.num_columns):
                    col = rg.column(c)
                    start = col.dictionary_page_offset or col.data_page_offset
                    start = min(start, col.data_page_offset)
                    lo, hi = min(lo, start), max(hi, start + col.total_compressed_size)
                for r in range(rg.num_rows):
                    keys.append(f"{g}:{r}")
                    spans.append((lo, hi))
                    rgs.append(g)
                    rows.append(r)
            footer = np.frombuffer(self._footer(info), np.uint8).copy()
            names = list(meta.schema.to_arrow_schema().names)
            tables.append(
                ShardTable(
                    keys=keys,
                    spans=np.array(spans, np.int64).reshape(-1, 2),
                    fields=names,
                    extra={
                        "rg": np.array(rgs, np.int32),
                        "row": np.array(rows, np.int64),
                        "footer_of": np.full(len(keys), len(tables), np.int32),
                    },
                )
            )
            self._footers = getattr(self, "_footers", {})
            self._footers[info.key] = footer
        self._tails = {}
        return tables

    def _footer(self, info: ShardInfo) -> bytes:
        """The file's footer (metadata, its length, ``PAR1``), from the end of the file."""
        cached = getattr(self, "_footers", {}).get(info.key)
        if cached is not None:
            return cached.tobytes()
        tail = getattr(self, "_tails", {}).get(info.key)
        if tail is None:
            tail = self._read(info, max(0, info.size - 65536), info.size)
        if len(tail) < 8 or tail[-4:] != b"PAR1":
            raise ShardFormatError(f"{info.key!r} is not a Parquet file (no PAR1 at its end)")
        (length,) = struct.unpack("<I", tail[-8:-4])
        if length + 8 > len(tail):
            tail = self._read(info, info.size - length - 8, info.size)
        return tail[-(length + 8) :]

    def _read_tails(self, infos: list[ShardInfo]) -> dict[str, bytes]:
        """The last 64 KiB of each remote file (its footer, mostly), one ranged GET each."""
        items = [(info, [(max(0, info.size - 65536), info.size)]) for info in infos]
        got = self.location.read_ranges(items)
        return {info.key: parts[0] for info, parts in zip(infos, got, strict=True)}

    def _read(self, info: ShardInfo, start: int, end: int) -> bytes:
        if not self.location.remote:
            with open(self.location.path(info.key), "rb") as f:
                f.seek(start)
                return f.read(end - start)
        return self.location.read_ranges([(info, [(start, end)])])[0][0]

    def check_fields(self) -> None:
        super().check_fields()
        have = self.index.fields
        if self.image is None:
            self._columns: list[str] | None = None  # every column
        else:
            wanted = self.image.split(";") + (self.label.split(";") if self.label else [])
            self._columns = [c for c in have if c in wanted]

    # Reading ------------------------------------------------------------------------
    def fetch(self, indices: Sequence[int]) -> list[bytes]:
        """Each row as a record of the wanted columns; a row group is decoded once."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= len(self.index)):
            raise IndexError(f"sample index out of range for {len(self.index)} samples")
        shards = self.index.sample_shard[idx].tolist()
        rgs = self.index.extra["rg"][idx].tolist()
        rows = self.index.extra["row"][idx].tolist()
        needed = list(dict.fromkeys(zip(shards, rgs, strict=True)))
        if self.location.remote and (self.keep or self.windowed):
            assert self.files is not None
            shards_needed = [self.index.shards[s] for s in dict.fromkeys(s for s, _ in needed)]
            self.files.ensure(self.location, shards_needed)
        groups = self._row_groups(needed)
        return [_record(groups[(s, g)][r]) for s, g, r in zip(shards, rgs, rows, strict=True)]

    def _row_groups(self, needed: list[tuple[int, int]]) -> dict[tuple[int, int], Any]:
        cache: OrderedDict[tuple[int, int], Any] = self.__dict__.setdefault(
            "_decoded", OrderedDict()
        )
        if cache and next(iter(cache.values()))[0] != os.getpid():
            cache.clear()  # a forked worker: decode its own
        out = {}
        todo = [k for k in needed if k not in cache]
        ranged = self.location.remote and not (self.keep or self.windowed)
        blobs = self._ranges(todo) if ranged else {}
        for key in needed:
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = (os.getpid(), self._decode(key, blobs.get(key)))
            out[key] = cache[key][1]
        while len(cache) > max(KEEP_ROW_GROUPS, len(needed)):
            cache.popitem(last=False)
        return out

    def _ranges(self, todo: list[tuple[int, int]]) -> dict[tuple[int, int], bytes]:
        """One ranged GET per row group (all in flight): its column chunks."""
        items = []
        for s, g in todo:
            a, b = self.index.spans[self._first_row(s, g)].tolist()
            items.append((self.index.shards[s], [(a, b)]))
        got = self.location.read_ranges(items)
        return {key: parts[0] for key, parts in zip(todo, got, strict=True)}

    def _first_row(self, s: int, g: int) -> int:
        """The sample number of row 0 of row group ``g`` of shard ``s``."""
        first, end = int(self.index.shard_first[s]), int(self.index.shard_first[s + 1])
        return first + int(np.searchsorted(self.index.extra["rg"][first:end], g))

    def _decode(self, key: tuple[int, int], blob: bytes | None) -> Any:
        import pyarrow.parquet as pq

        s, g = key
        info = self.index.shards[s]
        try:
            if blob is None:
                path = (
                    self.files.path(info) if self.location.remote else self.location.path(info.key)
                )
                pf = pq.ParquetFile(path)
            else:
                meta = pq.read_metadata(io.BytesIO(self._footer(info)))
                a = int(self.index.spans[self._first_row(s, g)][0])
                pf = pq.ParquetFile(_Sparse(blob, a, info.size), metadata=meta)
            return pf.read_row_group(g, columns=self._columns).to_pylist()
        except Exception as exc:
            raise SampleError(
                f"cannot read row group {g} of Parquet file {info.key!r} under "
                f"{self.location.url!r}: {type(exc).__name__}: {exc}",
                key=f"{info.key}:{g}",
            ) from exc

    def fields(self, index: int, raw: bytes) -> dict[str, Any]:
        (count,) = struct.unpack_from("<I", raw, 0)
        pos, out = 4, {}
        for _ in range(count):
            (n,) = struct.unpack_from("<H", raw, pos)
            name = raw[pos + 2 : pos + 2 + n].decode()
            (size,) = struct.unpack_from("<I", raw, pos + 2 + n)
            pos += 6 + n
            out[name] = raw[pos : pos + size]
            pos += size
        out.update(json.loads(raw[pos:]))
        return out


def _record(row: dict[str, Any]) -> bytes:
    """A row as bytes: binary columns (and an image struct's ``bytes``) framed, the rest JSON.

    Plain data, never a pickle: raw items may come from another node's cache.
    """
    binary, rest = [], {}
    for name, value in row.items():
        if isinstance(value, dict) and isinstance(value.get("bytes"), bytes):
            value = value["bytes"]  # Hugging Face Image feature: {"bytes", "path"}
        if isinstance(value, bytes):
            key = name.encode()
            binary.append(struct.pack("<H", len(key)) + key + struct.pack("<I", len(value)) + value)
        else:
            rest[name] = value
    return (
        struct.pack("<I", len(binary)) + b"".join(binary) + json.dumps(rest, default=str).encode()
    )


class _Sparse(io.RawIOBase):
    """A file of ``size`` bytes of which only ``blob`` at ``start`` is known (a row group)."""

    def __init__(self, blob: bytes, start: int, size: int):
        self.blob, self.start, self.size, self.pos = blob, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self.pos = pos if whence == 0 else self.pos + pos if whence == 1 else self.size + pos
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, buffer: Any) -> int:
        a = self.pos - self.start
        n = min(len(buffer), self.size - self.pos)
        if a < 0 or a + n > len(self.blob):
            raise OSError(f"read of bytes {self.pos}..{self.pos + n} outside the row group fetched")
        buffer[:n] = self.blob[a : a + n]
        self.pos += n
        return n
