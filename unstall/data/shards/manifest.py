"""One index object for a whole dataset beside its shards: ``_unstall_index/<format>.manifest.npz``.

The per-shard index objects (`index.beside_key`) cost one GET and one ``.npz``
parse each: at thousands of shards (ImageNet's 140 GB is ~2,200 shards of 64 MB)
that is seconds before the first batch. The manifest holds every shard's table
in one file of concatenated arrays, with each shard's key, size and version, so
a node reads one object and slices it; a shard whose size or version differs
from the manifest's (rewritten since) is indexed again, as with the per-shard
objects. Written by `unstall index URL` beside the per-shard objects.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np

from unstall.data.keys import KeyTable
from unstall.data.npz import read_npz
from unstall.data.shards.index import (
    BESIDE,
    INDEX_VERSION,
    ShardInfo,
    ShardTable,
    join_keys,
)


def manifest_key(kind: str) -> str:
    """The key of the dataset's manifest object under its location."""
    return f"{BESIDE}/{kind}.manifest.npz"


def to_manifest(infos: Sequence[ShardInfo], tables: Sequence[ShardTable]) -> bytes:
    """Every shard's table in one ``.npz``: arrays concatenated, per-shard counts and meta."""
    fields: dict[str, int] = {}
    member_field = []
    for t in tables:
        remap = np.array([fields.setdefault(f, len(fields)) for f in t.fields], np.int16)
        member_field.append(remap[t.member_field] if len(t.member_field) else t.member_field)
    blob, offsets = join_keys([t.keys for t in tables]).arrays()
    names = sorted(set.intersection(*(set(t.extra) for t in tables))) if tables else []
    out = io.BytesIO()
    np.savez(
        out,
        version=np.array([str(INDEX_VERSION)]),
        meta=np.array([[i.key, str(i.size), i.version] for i in infos], dtype=str).reshape(-1, 3),
        counts=np.array([len(t.keys) for t in tables], np.int64),
        member_counts=np.array([len(t.member_off) for t in tables], np.int64),
        key_blob=np.frombuffer(blob, np.uint8),
        key_offsets=offsets,
        spans=_cat([t.spans for t in tables], (0, 2)),
        members_per_sample=_cat([np.diff(t.first) for t in tables], (0,)),
        fields=np.array(list(fields), dtype=str) if fields else np.zeros(0, "U1"),
        member_field=_cat(member_field, (0,), np.int16),
        member_off=_cat([t.member_off for t in tables], (0,)),
        member_size=_cat([t.member_size for t in tables], (0,)),
        **{f"extra_{n}": _cat([t.extra[n] for t in tables], (0,)) for n in names},
    )
    return out.getvalue()


def _cat(parts: list[np.ndarray], empty: tuple[int, ...], dtype: type = np.int64) -> np.ndarray:
    return np.concatenate(parts) if parts else np.zeros(empty, dtype)


def from_manifest(data: bytes, infos: Sequence[ShardInfo]) -> dict[str, ShardTable]:
    """The tables of ``infos``' shards that the manifest holds at their current size and
    version, by key (others: absent, to be indexed another way). {} for a bad manifest."""
    try:
        arrays = read_npz(data)
        if arrays["version"].tolist() != [str(INDEX_VERSION)]:
            return {}
    except (OSError, KeyError, ValueError, EOFError):
        return {}
    want = {(i.key, str(i.size), i.version) for i in infos}
    counts, mcounts = arrays["counts"], arrays["member_counts"]
    first = np.concatenate([[0], np.cumsum(counts)])
    mfirst = np.concatenate([[0], np.cumsum(mcounts)])
    blob, offsets = arrays["key_blob"].tobytes(), arrays["key_offsets"]
    fields = [str(f) for f in arrays["fields"].tolist()]
    extra = [n for n in arrays if n.startswith("extra_")]
    out = {}
    for s, (key, size, version) in enumerate(arrays["meta"].tolist()):
        if (key, size, version) not in want:
            continue
        a, b, ma, mb = int(first[s]), int(first[s + 1]), int(mfirst[s]), int(mfirst[s + 1])
        ka, kb = int(offsets[a]), int(offsets[b])
        per = arrays["members_per_sample"][a:b]
        out[key] = ShardTable(
            keys=KeyTable.from_arrays(blob[ka:kb], offsets[a : b + 1] - ka),
            spans=arrays["spans"][a:b],
            fields=fields,
            first=np.concatenate([[0], np.cumsum(per)]).astype(np.int64),
            member_field=arrays["member_field"][ma:mb],
            member_off=arrays["member_off"][ma:mb],
            member_size=arrays["member_size"][ma:mb],
            extra={n[6:]: arrays[n][a:b] for n in extra},
        )
    return out
