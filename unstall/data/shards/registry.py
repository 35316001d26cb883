"""The shard formats by name: the one table ``unstall index`` (and anything else that picks a
format for a URL) reads. A new format is a `ShardFormat` module plus its line here."""

from __future__ import annotations

from unstall.data.shards.dataset import ShardDataset
from unstall.data.shards.mds import MDSShards
from unstall.data.shards.parquet import ParquetShards
from unstall.data.shards.tar import TarShards

#: Each format's class by its ``kind``.
FORMATS: dict[str, type[ShardDataset]] = {
    cls.kind: cls for cls in (TarShards, MDSShards, ParquetShards)
}
#: The format of a URL whose end names none (a directory, an ``s3://`` prefix).
DEFAULT = TarShards.kind


def format_for(url: str) -> str:
    """The format a URL names, by the suffix it ends with (a brace pattern's too:
    ``s3://b/train-{000..099}.tar``), else `DEFAULT`."""
    text = url.rstrip("/")
    for kind, cls in FORMATS.items():
        if text.endswith(cls.suffixes):
            return kind
    return DEFAULT
