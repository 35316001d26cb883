"""The shard formats by name: the one table ``unstall index`` (and anything else that picks a
format for a URL) reads. A new format is a `ShardFormat` module plus its line here.

The classes are imported when first used (`formats`): ``unstall --help`` lists the kinds
(`KINDS`) without importing torch (3 s of CPU before).
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from unstall.data.shards.dataset import ShardDataset

#: Each format's class, by its ``kind``: a name the package exports (its ``__init__`` says
#: which module defines it).
CLASSES: dict[str, str] = {"tar": "TarShards", "mds": "MDSShards", "parquet": "ParquetShards"}
#: The formats' names, in `CLASSES`' order.
KINDS: tuple[str, ...] = tuple(CLASSES)
#: The format of a URL whose end names none (a directory, an ``s3://`` prefix).
DEFAULT = "tar"


@functools.cache
def formats() -> dict[str, type[ShardDataset]]:
    """Each format's class by its ``kind``: imported on the first call, then the same dict
    (a format added to it is seen by `format_for` and ``unstall index``)."""
    package = importlib.import_module(__package__)
    table: dict[str, type[ShardDataset]] = {}
    for kind, name in CLASSES.items():
        cls = getattr(package, name)
        if cls.kind != kind:
            raise RuntimeError(f"{name} has kind {cls.kind!r}, listed as {kind!r}")
        table[kind] = cls
    return table


def format_for(url: str) -> str:
    """The format a URL names, by the suffix it ends with (a brace pattern's too:
    ``s3://b/train-{000..099}.tar``), else `DEFAULT`."""
    text = url.rstrip("/")
    for kind, cls in formats().items():
        if text.endswith(cls.suffixes):
            return kind
    return DEFAULT
