"""Datasets over shards read in place: WebDataset tars, MDS and Parquet, local or ``s3://``.

Each is map-style (samples by index) with ``fetch``/``prepare`` like
`unstall.FileDataset`, so `unstall.DataLoader`'s order, resume, caches and
coordination apply unchanged. See ``ShardDataset`` for the read modes and
``order`` for the shuffle modes; ``ShardFormat`` for the hooks a format implements and
``registry.formats()`` for the formats by name.

Names load on first use: the local copies (`shard_files`, which `unstall cache list` reads)
import without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unstall.lazy import homes_of, lazy_exports

_HOMES = homes_of(
    {
        "unstall.data.shards.dataset": "ShardDataset",
        "unstall.data.shards.format": "ShardFormat",
        "unstall.data.shards.index": "ShardTable",
        "unstall.data.shards.mds": "MDSShards",
        "unstall.data.shards.parquet": "ParquetShards",
        "unstall.data.shards.tar": "ShardFormatError TarShards",
        "unstall.data.shards.urls": "expand",
    }
)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

if TYPE_CHECKING:
    from unstall.data.shards.dataset import ShardDataset
    from unstall.data.shards.format import ShardFormat
    from unstall.data.shards.index import ShardTable
    from unstall.data.shards.mds import MDSShards
    from unstall.data.shards.parquet import ParquetShards
    from unstall.data.shards.tar import ShardFormatError, TarShards
    from unstall.data.shards.urls import expand

__all__ = [
    "MDSShards",
    "ParquetShards",
    "ShardDataset",
    "ShardFormat",
    "ShardFormatError",
    "ShardTable",
    "TarShards",
    "expand",
]
