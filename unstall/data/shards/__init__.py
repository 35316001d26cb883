"""Datasets over shards read in place: WebDataset tars, MDS and Parquet, local or ``s3://``.

Each is map-style (samples by index) with ``fetch``/``prepare`` like
`unstall.FileDataset`, so `unstall.DataLoader`'s order, resume, caches and
coordination apply unchanged. See ``ShardDataset`` for the read modes and
``order`` for the shuffle modes; ``ShardFormat`` for the hooks a format implements and
``registry.FORMATS`` for the formats by name.
"""

from __future__ import annotations

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
