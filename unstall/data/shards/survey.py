"""The survey of a sharded dataset: its shards listed, how they are read, each one's index.

Each shard's index comes from the first of: the local index files (kept per
shard as each completes, so a survey stopped part way resumes where it stopped),
the index objects beside the shards (`unstall index URL`, or `publish` after a
survey: other nodes and later runs then read no shard to index it), or built
now from the shard. A stored index is used only if it was built from the
shard's current size and version (ETag or ``mtime_ns``): a shard rewritten
since is indexed again, never read at stale offsets.

Nothing here forks: remote requests go through the location's store, which
sends the requests of the process that made it to its helper process.
"""

from __future__ import annotations

from typing import Any

from unstall.data.shards.index import (
    ShardInfo,
    ShardTable,
    beside_key,
    from_bytes,
    index_dir,
    load,
    save,
    to_bytes,
)
from unstall.data.shards.manifest import from_manifest, manifest_key, to_manifest


def survey(ds: Any, keys: list[str] | None, disk: int | str) -> list[ShardInfo]:
    """List ``ds``'s shards and decide how remote ones are read (sets ``keep``,
    ``windowed``, ``disk_budget`` on ``ds``); returns the shards."""
    infos = ds.location.listing(keys, ds.suffixes)
    total = sum(i.size for i in infos)
    #: keep: every remote shard copied to local disk once; windowed: the current window's
    #: shards copied, older ones evicted
    ds.keep = ds.windowed = False
    budget = total
    if ds.location.remote:
        budget = disk_budget(total) if disk == "auto" else int(disk)
        ds.keep = total <= budget
        biggest = max((i.size for i in infos), default=0)
        ds.windowed = (
            not ds.keep and ds.shuffle_mode == "window" and budget >= (ds.window + 1) * biggest > 0
        )
        ds.files.remove_stale(infos)
    ds.disk_budget = budget
    return infos


def disk_budget(dataset_bytes: int) -> int:
    """Local bytes for whole remote shards: the cache's own rule for its disk tier
    (min(dataset + 10 %, half the free space, free space - 10 GiB), in its directory)."""
    from unstall.cache.tiers import auto_disk_bytes

    return auto_disk_bytes(dataset_bytes)


def gather(ds: Any, infos: list[ShardInfo], *, defer: bool = False) -> list[ShardTable | None]:
    """Each shard's table: stored locally, stored beside the shards, or built
    (`ShardFormat.build_index`) and saved; with ``defer``, None for the shards to be indexed
    as they land (`growing.Growth`). Sets ``ds.index_sources`` (how many shards came from
    where)."""
    directory = index_dir(ds.location.url, ds.kind)
    tables: list[ShardTable | None] = [load(directory, info) for info in infos]
    local = sum(t is not None for t in tables)
    beside = from_beside(ds, directory, infos, tables) if ds.beside_index else 0
    todo = [i for i, t in enumerate(tables) if t is None]
    if todo and defer:
        ds.index_sources = {"local": local, "beside": beside, "built": 0}
        return tables
    if todo:
        built = ds.build_index([infos[i] for i in todo], directory)
        for i, table in zip(todo, built, strict=True):
            save(directory, infos[i], table)
            tables[i] = table
    ds.index_sources = {"local": local, "beside": beside, "built": len(todo)}
    return tables


def from_beside(
    ds: Any, directory: str, infos: list[ShardInfo], tables: list[ShardTable | None]
) -> int:
    """Fill ``tables``' gaps from the index beside the shards: the dataset's manifest (one
    GET for every shard) or each shard's own object (one GET each, all in flight), only
    those the listing showed and built from the shard's current version; per-shard objects
    are saved locally too. Returns how many shards were filled."""
    listed = ds.location.listed
    used = 0
    missing = [i for i, t in enumerate(tables) if t is None]
    key = manifest_key(ds.kind)
    if missing and key in listed:
        got = from_manifest(ds.location.get_many([key])[0], [infos[i] for i in missing])
        for i in missing:
            if infos[i].key in got:
                tables[i] = got[infos[i].key]
                used += 1
    wanted = [(i, beside_key(ds.kind, infos[i].key)) for i, t in enumerate(tables) if t is None]
    present = [(i, key) for i, key in wanted if key in listed]
    if not present:
        return used
    blobs = ds.location.get_many([key for _, key in present])
    for (i, _key), data in zip(present, blobs, strict=True):
        table = from_bytes(data, infos[i])  # None: built from another version of the shard
        if table is not None:
            save(directory, infos[i], data)
            tables[i] = table
            used += 1
    return used


def publish(ds: Any) -> int:
    """Write the index beside the shards (where the store is writable): each shard's object
    and the dataset's manifest, so other nodes and later runs read no shard to index it;
    returns the objects written."""
    sources = ds.index_sources
    infos = list(ds.index.shards)
    tables = gather(ds, infos)  # stored locally or beside by now: nothing is read again
    ds.index_sources = sources
    assert all(t is not None for t in tables)
    pairs = zip(infos, tables, strict=True)
    items = [(beside_key(ds.kind, i.key), to_bytes(i, t)) for i, t in pairs]  # type: ignore[arg-type]
    items.append((manifest_key(ds.kind), to_manifest(infos, tables)))  # type: ignore[arg-type]
    ds.location.put_many(items)
    return len(items)
