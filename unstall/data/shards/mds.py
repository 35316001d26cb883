"""MosaicML MDS shards read in place: Mosaic's ``index.json`` plus each shard's offset table.

An MDS shard (``streaming``'s ``MDSWriter``, format version 2) starts with the
sample count ``n`` (uint32) and ``n + 1`` uint32 offsets; sample ``j`` is the
bytes ``[offset[j], offset[j+1])``: a uint32 size per variable-size column,
then the columns' data in order. ``index.json`` names the shards, columns and
encodings. Mosaic users point `MDSShards` at the same directory or prefix; no
conversion. Image columns (``jpeg``, ``png``) come as their encoded bytes, for
unstall's decoders (Mosaic returns PIL images); ``pkl`` columns are refused
(unpickling data runs code).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import numpy as np

from unstall.data.shards.dataset import ShardDataset
from unstall.data.shards.format import Gather
from unstall.data.shards.index import ShardInfo, ShardTable
from unstall.data.shards.tar import ShardFormatError

INDEX = "index.json"
_SCALARS = {
    "uint8": np.uint8, "uint16": np.uint16, "uint32": np.uint32, "uint64": np.uint64,
    "int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64,
    "float16": np.float16, "float32": np.float32, "float64": np.float64,
}  # fmt: skip
_AS_BYTES = {"bytes", "jpeg", "png"}


class MDSShards(ShardDataset):
    """MDS shards (a directory or ``s3://`` prefix with Mosaic's ``index.json``), by index.

    Default fields: the image from column ``image`` (or ``jpg``/``img``/``x``), the label
    from ``label`` (or ``cls``/``y``). See `ShardDataset` for the other arguments.
    """

    kind = "mds"
    suffixes = (".mds", INDEX)
    default_image = "image;jpg;jpeg;img;x"
    default_label = "label;cls;y"

    def __init__(self, source: Any, **kwargs: Any):
        if isinstance(source, str) and source.rstrip("/").endswith(INDEX):
            source = source.rstrip("/")[: -len(INDEX)].rstrip("/")
        super().__init__(source, **kwargs)

    def shard_tables(
        self, infos: list[ShardInfo], gather: Gather
    ) -> tuple[list[ShardInfo], list[ShardTable | None]]:
        """The shards and their order from ``index.json``, not from the listing; each table
        checked against its count there."""
        index = self._read_index(infos)
        by_key = {i.key: i for i in infos}
        self.columns: list[tuple[str, str, int | None]] = []
        shards = []
        for n, entry in enumerate(index.get("shards", [])):
            shards.append(self._shard_entry(n, entry, by_key))
        if not shards:
            raise ShardFormatError(f"{INDEX} under {self.location.url!r} lists no shards")
        self.index_shards = shards
        tables = gather([info for info, _count in shards])
        for (info, count), table in zip(shards, tables, strict=True):
            if table is not None and len(table.keys) != count:
                raise ShardFormatError(
                    f"MDS shard {info.key!r} holds {len(table.keys)} samples, {INDEX} says {count}"
                )
        return [info for info, _count in shards], tables

    def _read_index(self, infos: list[ShardInfo]) -> dict[str, Any]:
        found = [i for i in infos if i.key == INDEX]
        if not found:
            raise ShardFormatError(f"no {INDEX} under {self.location.url!r}: not an MDS dataset")
        data = self._read_heads([(found[0], found[0].size)])[0]
        try:
            return json.loads(data)
        except ValueError as exc:
            where = f"{INDEX} under {self.location.url!r}"
            raise ShardFormatError(f"{where} is not JSON: {exc}") from exc

    def _shard_entry(
        self, n: int, entry: dict[str, Any], by_key: dict[str, ShardInfo]
    ) -> tuple[ShardInfo, int]:
        where = f"shard {n} of {INDEX} under {self.location.url!r}"
        if entry.get("format") != "mds":
            raise ShardFormatError(f"{where} has format {entry.get('format')!r}; only mds is read")
        if entry.get("compression"):
            raise ShardFormatError(
                f"{where} is compressed ({entry['compression']}): read in place needs "
                "uncompressed shards (MDSWriter(compression=None))"
            )
        names, encodings = entry["column_names"], entry["column_encodings"]
        columns = list(zip(names, encodings, entry["column_sizes"], strict=True))
        if not self.columns:
            self.columns = columns
        elif columns != self.columns:
            raise ShardFormatError(f"{where} has other columns than shard 0: {columns}")
        basename = entry["raw_data"]["basename"]
        if basename not in by_key:
            raise ShardFormatError(f"{where}: its file {basename!r} is missing")
        info = by_key[basename]
        if info.size != entry["raw_data"]["bytes"]:
            raise ShardFormatError(
                f"MDS shard {basename!r} is {info.size} bytes, {INDEX} says "
                f"{entry['raw_data']['bytes']}: truncated or rewritten"
            )
        return info, int(entry["samples"])

    def build_index(self, infos: list[ShardInfo], directory: str) -> list[ShardTable]:
        counts = {info.key: count for info, count in self.index_shards}
        heads = self._read_heads([(i, 4 * (counts[i.key] + 2)) for i in infos])
        names = [name for name, _enc, _size in self.columns]
        tables = []
        for info, head in zip(infos, heads, strict=True):
            n = counts[info.key]
            words = np.frombuffer(head, dtype="<u4")
            if len(words) < n + 2 or int(words[0]) != n:
                raise ShardFormatError(
                    f"MDS shard {info.key!r}: header says {int(words[0]) if len(words) else 0} "
                    f"samples, {INDEX} says {n}"
                )
            offsets = words[1 : n + 2].astype(np.int64)
            if int(offsets[-1]) > info.size or np.any(np.diff(offsets) < 0):
                bad = int(np.argmax(offsets > info.size)) - 1 if offsets[-1] > info.size else 0
                raise ShardFormatError(
                    f"MDS shard {info.key!r} is truncated or corrupt: sample {max(bad, 0)} "
                    f"ends past its {info.size} bytes",
                    key=f"{info.key}:{max(bad, 0)}",
                )
            spans = np.stack([offsets[:-1], offsets[1:]], axis=1)
            tables.append(ShardTable(keys=[str(j) for j in range(n)], spans=spans, fields=names))
        return tables

    def _read_heads(self, items: list[tuple[ShardInfo, int]]) -> list[bytes]:
        """The first bytes of each file: one ranged GET each, all in flight (remote shards are
        then downloaded in the background, in the order the epoch needs them), or read."""
        if self.location.remote:
            got = self.location.read_ranges([(info, [(0, size)]) for info, size in items])
            return [parts[0] for parts in got]
        out = []
        for info, size in items:
            with open(self.location.path(info.key), "rb") as f:
                out.append(f.read(size))
        return out

    def fields(self, index: int, raw: bytes) -> dict[str, Any]:
        sizes, pos = [], 0
        for _name, _enc, size in self.columns:
            if size:
                sizes.append(int(size))
            else:
                sizes.append(int.from_bytes(raw[pos : pos + 4], "little"))
                pos += 4
        out: dict[str, Any] = {}
        for (name, enc, _s), size in zip(self.columns, sizes, strict=True):
            if pos + size > len(raw):
                raise ShardFormatError(
                    f"sample {index} ({self.key(index)}): column {name!r} needs {size} bytes at "
                    f"{pos}, the sample has {len(raw)}: corrupt shard",
                    index=index,
                    key=self.key(index),
                )
            out[name] = _decode(enc, raw[pos : pos + size], name)
            pos += size
        return out


def _decode(encoding: str, data: bytes, column: str) -> Any:
    if encoding in _AS_BYTES:
        return data
    if encoding == "str":
        return data.decode("utf-8")
    if encoding == "int":
        return int.from_bytes(data, "little", signed=True)
    if encoding in _SCALARS:
        return np.frombuffer(data, _SCALARS[encoding])[0].item()
    if encoding == "str_int":
        return int(data.decode())
    if encoding == "str_float":
        return float(data.decode())
    if encoding == "str_decimal":
        return Decimal(data.decode())
    if encoding == "json":
        return json.loads(data.decode("utf-8"))
    raise ValueError(
        f"column {column!r} has MDS encoding {encoding!r}, which MDSShards does not read "
        f"(it reads bytes, str, int, json, jpeg, png, str_int/float/decimal and scalars)"
    )
