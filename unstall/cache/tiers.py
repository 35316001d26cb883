"""The loader's default cache: a disk tier for remote datasets, none for local ones.

`default_layer` is what a loader binds when its ``cache=`` argument is not given
(`unstall.loader.cache_binding` decides that, once): a disk tier
(``Cache(disk="auto")``) when the dataset's store is remote (``s3://``, ``http(s)://``:
no local files behind it), and no cache for local datasets, whose files the page cache
and the disk already hold. The disk budget ("auto") and root are
`unstall.cache.disk_tier.auto_disk_bytes` and `unstall.machine.cache_dir`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from unstall.cache.cache import Cache
from unstall.cache.capacity import format_bytes, local_store
from unstall.cache.disk_files import auto_disk_bytes, free_bytes, tier_dir
from unstall.cache.items import item_versions
from unstall.cache.tiered import TieredLayer

log = logging.getLogger("unstall")
_announced: set[str] = set()


def is_remote(dataset: Any) -> bool:
    """True if the dataset reads from a store with no local files behind it (``s3://``...)."""
    store = getattr(dataset, "store", None)
    return store is not None and local_store(store) is None


def default_layer(dataset: Any) -> Any:
    """The default fetch layer of ``dataset`` (one of unstall's datasets, a
    `unstall.stores.base.KeyedDataset`): a disk tier if its store is remote, else None."""
    if not is_remote(dataset):
        return None
    try:
        item_versions(dataset)  # the listing that gives each item's version
    except Exception as exc:  # a store that fails now fails the epoch, naming the sample
        _say(
            f"unstall: no disk cache for {getattr(dataset.store, 'url', 'the dataset')}: "
            f"listing the objects' versions failed ({type(exc).__name__}: {exc})"
        )
        return None
    layer = Cache(disk="auto").bind(dataset)
    _announce(layer, dataset)
    return layer


def _announce(layer: TieredLayer, dataset: Any) -> None:
    """One line per dataset and process: where the default disk tier is, its size, how to change."""
    disk = layer.disk
    assert disk is not None
    if disk.name in _announced:
        return
    _announced.add(disk.name)
    url = getattr(getattr(dataset, "store", None), "url", "the dataset")
    if disk.path is None:
        line = f"unstall: {disk.reason} for {url} (epoch 2 fetches from storage again)"
    else:
        line = (
            f"unstall: caching {url} on local disk in {tier_dir()}, up to "
            f"{format_bytes(disk.capacity)} (epoch 2 reads it from there); change with "
            "cache=unstall.Cache(ram=..., disk=...) or $UNSTALL_CACHE_DIR, turn off with "
            "cache=False"
        )
    _say(line)


def _say(line: str) -> None:
    if logging.getLogger("unstall").hasHandlers():
        log.info(line)
    else:  # logging not set up: the line must still be seen once
        print(line, file=sys.stderr, flush=True)


__all__ = ["auto_disk_bytes", "default_layer", "free_bytes", "is_remote"]
