"""`ShardFormat`: the hooks a shard format implements; `ShardDataset` does everything else.

A format says how one kind of shard file is indexed (where each sample's bytes lie)
and how a sample's bytes are read back into fields. Listing, the stored indexes (local
and beside the shards), downloads, read modes, order, resume and caches are the
dataset's and the same for every format. A format is one module: a `ShardDataset`
subclass that sets `kind` and `suffixes` and implements `build_index` and `fields`,
listed in `registry.formats()` (``unstall index`` and its ``--format`` read that table).
The other hooks have defaults a format overrides only when it can do better.

The hooks run on the dataset: ``self.location`` (the shards' store, `Location`),
``self.files`` (local copies of remote shards, or None), ``self.keep`` (remote
shards copied whole to local disk), ``self.index`` (the joined index, once built),
``self.image`` and ``self.label`` (the fields asked for) are set when they are called.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from unstall.data.shards.index import ShardIndex, ShardInfo, ShardTable

#: ``gather(infos)``: each shard's table, stored (locally or beside the shards) or built by
#: `ShardFormat.build_index` and saved; None for a shard left to index as it lands.
Gather = Callable[[list[ShardInfo]], list[ShardTable | None]]


class ShardFormat(ABC):
    """The hooks of one shard format (a mixin of `ShardDataset`).

    Required: the class attributes `kind` and `suffixes`, and `build_index` and `fields`.
    Optional: `default_image`, `default_label`, `lazy_index` and the hooks `shard_tables`,
    `check_fields`, `wanted_fields`, `direct_spans`, `on_landing`.
    """

    #: The format's name: ``unstall index --format``, the index objects' folder
    #: (``_unstall_index/<kind>/``), the fingerprint, ``stats()["shards"]["format"]``.
    kind: ClassVar[str] = "shards"
    #: The file names that are this format's shards (a directory's listing is filtered by
    #: them; ``unstall index URL`` picks the format whose suffix ends the URL).
    suffixes: ClassVar[tuple[str, ...]] = ()
    #: Fields (``;``-separated alternatives) holding the image and the label by default.
    default_image: ClassVar[str | None] = "jpg;jpeg;png;webp;image;img"
    default_label: ClassVar[str | None] = "cls"
    #: Whether a shard's index needs the whole shard (tar: headers through the file): a fresh
    #: remote dataset then indexes each shard as it lands (`on_landing`, `growing`).
    lazy_index: ClassVar[bool] = False

    location: Any
    files: Any
    keep: bool
    index: ShardIndex
    image: str | None
    label: str | None

    @abstractmethod
    def build_index(self, infos: list[ShardInfo], directory: str) -> list[ShardTable]:
        """Index these shards (none stored yet, or changed since): one `ShardTable` each, in
        order, giving each sample's key and byte span ``[start, end)`` in its shard (and any
        per-sample arrays a format needs later, in ``extra``). A format may save each table
        in ``directory`` as it completes (`index.save`); the dataset saves the rest. Raise
        `ShardFormatError` naming the shard for a corrupt one."""

    @abstractmethod
    def fields(self, index: int, raw: bytes) -> dict[str, Any]:
        """Sample ``index``'s fields by name, from its raw bytes (its span of the shard)."""

    def shard_tables(
        self, infos: list[ShardInfo], gather: Gather
    ) -> tuple[list[ShardInfo], list[ShardTable | None]]:
        """The shards, in dataset order, and each one's table from ``gather``. ``infos`` are
        the listed files with this format's suffixes, in key order; a format whose shards are
        named by a file of their own (MDS: ``index.json``) picks and orders them here, and
        checks the tables against it."""
        return infos, gather(infos)

    def check_fields(self) -> None:
        """Called once the index is known: fail at construction when ``image`` or ``label``
        names no field of the shards, naming the fields there are (`ShardDataset`'s does)."""

    def wanted_fields(self, index: int, raw: bytes) -> dict[str, Any]:
        """The fields ``prepare`` needs (image and label) by name; a format may skip the rest
        (tar: the other members are not copied)."""
        return self.fields(index, raw)

    def direct_spans(self) -> tuple[np.ndarray, np.ndarray | None]:
        """(span per sample, labels): a format that can read the image alone gives the
        image's spans and each label (from its index), so ``prepare`` copies nothing; by
        default (the whole samples' spans, None)."""
        return self.index.spans, None

    def on_landing(self, infos: list[ShardInfo], directory: str) -> Any:
        """A ``then(path, key)`` for a background download of these shards, which indexes
        each as it lands and saves its table in ``directory`` (a `lazy_index` format), or
        None. It runs where the store downloads: it must pickle."""
        return None
