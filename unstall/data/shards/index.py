"""The index of a sharded dataset: where each sample lies in which shard, tied to shard versions.

Built once per shard (tar: its member headers; MDS: its offset table; Parquet:
its footer) and kept as one small ``.npz`` per shard under
``$UNSTALL_CACHE_DIR/shards/index/<location>/``, next to the caches, saved as
each shard completes (a survey stopped part way resumes where it stopped). The
same bytes can be kept beside the shards, ``<location>/_unstall_index/<format>/
<shard>.npz`` (`unstall index URL`), so other nodes and later runs read no shard
to index it. Each records the shard's size and version (ETag on S3, mtime
locally): a shard whose size or version differs is indexed again, never read at
stale offsets.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from unstall.data.keys import KeyTable
from unstall.data.npz import read_npz
from unstall.machine import cache_dir

INDEX_VERSION = 2
#: Where index objects beside the shards live, under the shards' location.
BESIDE = "_unstall_index"


@dataclass(frozen=True)
class ShardInfo:
    """One shard: its key under the dataset's location, size in bytes, and version
    (an S3 ETag, or ``mtime_ns`` of a local file)."""

    key: str
    size: int
    version: str


@dataclass
class ShardTable:
    """One shard's samples: keys, byte spans ``[start, end)``, and optional named members.

    ``members`` (tar): sample ``s`` has members ``first[s]:first[s+1]``, each with a
    field name id (into ``fields``), an offset relative to the span start and a size.
    """

    keys: Sequence[str]  # a list, or a `KeyTable` (loaded: no Python string per key)
    spans: np.ndarray  # (n, 2) int64
    fields: list[str] = field(default_factory=list)
    first: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    member_field: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int16))
    member_off: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    member_size: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    extra: dict[str, np.ndarray] = field(default_factory=dict)


#: A file in each local directory of a location (copies, index) naming it: `unstall cache list`.
LOCATION_FILE = "location.txt"


def index_root() -> str:
    """Where every location's local index files are: ``$UNSTALL_CACHE_DIR/shards/index``."""
    return os.path.join(cache_dir(), "shards", "index")


def index_dir(location: str, kind: str) -> str:
    """Where the per-shard index files of ``kind`` shards at ``location`` are kept (made, and
    named by its location, here)."""
    digest = hashlib.blake2b(f"{kind}:{location}".encode(), digest_size=12).hexdigest()
    directory = os.path.join(index_root(), digest)
    name_dir(directory, location)
    return directory


def name_dir(directory: str, location: str) -> None:
    """Make ``directory`` and record in it which location it holds files of."""
    os.makedirs(directory, exist_ok=True)
    named = os.path.join(directory, LOCATION_FILE)
    if not os.path.exists(named):
        with contextlib.suppress(OSError):
            tmp = f"{named}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(location)
            os.replace(tmp, named)


def index_file(directory: str, info: ShardInfo) -> str:
    """The local index file of ``info``'s shard in ``directory``."""
    digest = hashlib.blake2b(info.key.encode(), digest_size=12).hexdigest()
    return os.path.join(directory, f"{digest}.npz")


def beside_key(kind: str, key: str) -> str:
    """The key of the index object of shard ``key``, beside the shards (`unstall index URL`)."""
    return f"{BESIDE}/{kind}/{key}.npz"


def load(directory: str, info: ShardInfo) -> ShardTable | None:
    """The stored table of ``info``'s shard if it was built from this size and version."""
    try:
        with open(index_file(directory, info), "rb") as f:
            return from_bytes(f.read(), info)
    except OSError:
        return None


def from_bytes(data: bytes, info: ShardInfo) -> ShardTable | None:
    """The table in ``data`` (a stored index file or object) if it was built from ``info``'s
    size and version, else None: a shard rewritten since is indexed again."""
    try:
        z = read_npz(data)
        meta = z["meta"].tolist()
        if meta != [str(INDEX_VERSION), info.key, str(info.size), info.version]:
            return None
        return ShardTable(
            keys=KeyTable.from_arrays(z["key_blob"].tobytes(), z["key_offsets"]),
            spans=z["spans"],
            fields=[str(f) for f in z["fields"].tolist()],
            first=z["first"],
            member_field=z["member_field"],
            member_off=z["member_off"],
            member_size=z["member_size"],
            extra={k[6:]: v for k, v in z.items() if k.startswith("extra_")},
        )
    except (OSError, KeyError, ValueError, EOFError):
        return None


def to_bytes(info: ShardInfo, table: ShardTable) -> bytes:
    """``table`` for ``info`` as the bytes of an ``.npz`` file (stored locally or beside)."""
    blob, offsets = as_key_table(table.keys).arrays()
    out = io.BytesIO()
    np.savez(
        out,
        meta=np.array([INDEX_VERSION, info.key, str(info.size), info.version]),
        key_blob=np.frombuffer(blob, dtype=np.uint8),
        key_offsets=offsets,
        spans=table.spans,
        fields=np.array(table.fields, dtype=str) if table.fields else np.zeros(0, dtype="U1"),
        first=table.first,
        member_field=table.member_field,
        member_off=table.member_off,
        member_size=table.member_size,
        **{f"extra_{k}": v for k, v in table.extra.items()},
    )
    return out.getvalue()


def save(directory: str, info: ShardInfo, table: ShardTable | bytes) -> None:
    """Store ``table`` for ``info`` (atomically: a reader sees the old file or the new one)."""
    os.makedirs(directory, exist_ok=True)
    path = index_file(directory, info)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        f.write(table if isinstance(table, bytes) else to_bytes(info, table))
    os.replace(tmp, path)


def as_key_table(keys: Sequence[str]) -> KeyTable:
    return keys if isinstance(keys, KeyTable) else KeyTable(keys)


def join_keys(parts: Sequence[Sequence[str]]) -> KeyTable:
    """The keys of every part in order, as one table (tables joined without a string each)."""
    arrays = [as_key_table(p).arrays() for p in parts]
    if not arrays:
        return KeyTable([])
    blob = b"".join(b for b, _ in arrays)
    bases = np.cumsum([0] + [len(b) for b, _ in arrays[:-1]])
    shifted = [o[1:] + base for (_b, o), base in zip(arrays, bases, strict=True)]
    offsets = np.concatenate([np.zeros(1, np.int64), *shifted])
    return KeyTable.from_arrays(blob, offsets.astype(np.int64))


class ShardIndex:
    """All shards' tables joined: sample ``i`` -> (shard, span, members), over arrays only.

    Arrays and one key table (no per-sample Python objects), so forked workers do
    not copy it page by page through reference counting.
    """

    def __init__(self, shards: Sequence[ShardInfo], tables: Sequence[ShardTable]):
        self.shards = list(shards)
        counts = np.array([len(t.keys) for t in tables], dtype=np.int64)
        self.shard_first = np.zeros(len(tables) + 1, dtype=np.int64)
        np.cumsum(counts, out=self.shard_first[1:])
        self.sample_shard = np.repeat(np.arange(len(tables), dtype=np.int32), counts)
        self.spans = (
            np.concatenate([t.spans for t in tables]).astype(np.int64)
            if tables
            else np.zeros((0, 2), np.int64)
        )
        self.keys = join_keys([t.keys for t in tables])
        self.fields: list[str] = []
        field_id: dict[str, int] = {}
        firsts, mfield, moff, msize = [np.zeros(1, np.int64)], [], [], []
        base = 0
        for t in tables:
            remap = np.array([field_id.setdefault(f, len(field_id)) for f in t.fields], np.int16)
            if len(t.member_field):
                mfield.append(remap[t.member_field])
            moff.append(t.member_off)
            msize.append(t.member_size)
            firsts.append(t.first[1:] + base)
            base += len(t.member_off)
        self.fields = list(field_id)
        self.first = np.concatenate(firsts)
        self.member_field = np.concatenate(mfield) if mfield else np.zeros(0, np.int16)
        self.member_off = np.concatenate(moff) if moff else np.zeros(0, np.int64)
        self.member_size = np.concatenate(msize) if msize else np.zeros(0, np.int64)
        #: (field, offset, size) per member in one array: one ``tolist`` per sample
        self.member_rows = np.stack(
            [self.member_field.astype(np.int64), self.member_off, self.member_size], axis=1
        )
        self.extra = {
            name: np.concatenate([t.extra[name] for t in tables])
            for name in (tables[0].extra if tables else {})
        }

    def __len__(self) -> int:
        return len(self.sample_shard)

    def members(self, index: int) -> list[tuple[str, int, int]]:
        """(field name, offset in the sample's span, size) of each member of sample ``index``."""
        a, b = int(self.first[index]), int(self.first[index + 1])
        return [(self.fields[f], o, s) for f, o, s in self.member_rows[a:b].tolist()]

    def fingerprint(self) -> str:
        """Names the layout: every shard's key and sample count, and every sample's key.

        Not the shards' versions: a shard rewritten with the same samples keeps the
        fingerprint (and a cache's other hits); its samples' bytes are then stale misses
        by `ShardDataset.versions`, never served.
        """
        digest = hashlib.blake2b(digest_size=16)
        counts = np.diff(self.shard_first).tolist()
        for s, n in zip(self.shards, counts, strict=True):
            digest.update(f"{s.key}\0{n}\n".encode())
        digest.update(self.keys.arrays()[0])
        return digest.hexdigest()
