"""What a sharded dataset reports in ``stats()["shards"]``: how it reads, orders and indexes."""

from __future__ import annotations

from typing import Any

from unstall.data.shards import order


def mode(ds: Any) -> str:
    """How samples are read: local files, whole shards on local disk, or range GETs."""
    if not ds.location.remote:
        return "local files, read in place"
    if ds.keep:
        return "whole shards on local disk"
    if ds.windowed:
        return (
            f"whole shards of the current window on local disk, older ones evicted "
            f"beyond {ds.disk_budget} bytes"
        )
    return "coalesced range GETs"


def stats(ds: Any, growth: Any) -> dict[str, Any]:
    """``{"shards": ...}``: format, read mode, shuffle mode and its cost, requests (``growth``:
    the dataset's `growing.Growth`, how far its index reaches)."""
    infos = growth.infos
    out: dict[str, Any] = {
        "format": ds.kind,
        "location": ds.location.url,
        "shards": len(infos),
        "samples": len(ds.index) if ds.length_known else None,
        "length": (
            "known"
            if ds.length_known
            else f"not known yet: {growth.ready} of {len(infos)} shards indexed "
            "(len() indexes the rest first; epoch 0 streams while they land)"
        ),
        "read": ds.mode(),
        "shuffle": order.describe(ds.shuffle_mode, ds.window, len(infos)),
        "first_epoch": (
            order.describe_first(ds.window, len(infos))
            if ds.first_window
            else "as the other epochs"
        ),
        "index": growth.sources(),
    }
    if ds.location.remote:
        out.update(ds.location.stats())
        assert ds.files is not None
        out["disk_budget_bytes"] = ds.disk_budget
        out["local_dir"] = ds.files.dir
        out["local_shards"] = sum(ds.files.have(i) for i in infos)
    return {"shards": out}
