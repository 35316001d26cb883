"""`ShardDataset`: samples by index from shards read in place (tar, MDS, Parquet), local or S3.

Like `unstall.FileDataset`, loading is ``fetch(indices)`` (raw bytes, a whole
batch at once) then ``prepare(index, raw)``; a sample's raw bytes are its span
of the shard, so unstall's RAM cache, peers, coordination and resume work on
them unchanged. How a batch's spans are read depends on where the shards are:

local files are read with ``pread`` in place; remote shards that fit the local shard
budget (the default) are downloaded whole once per node (`ShardFiles`), in the background
in the order the epoch needs them; larger datasets read a batch's spans with a few
coalesced range GETs per shard (`plan_ranges`). Every request goes through the location's
store (`unstall.stores`). Making the dataset lists the shards and finds each one's index
(`survey`); with a stored index (local, or beside the shards) it reads no shard. A fresh
remote tar dataset indexes its first shard then and the others as they land (`growing`):
its length is known once they have (``length_known``; ``len()`` waits for them), and
epoch 0 streams window by window meanwhile.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch.utils.data

from unstall.data.shards import growing, order, report, survey
from unstall.data.shards.format import ShardFormat
from unstall.data.shards.index import ShardInfo
from unstall.data.shards.location import Location
from unstall.data.shards.ranges import fetch_ranges
from unstall.data.shards.shard_files import ShardFiles
from unstall.data.shards.urls import resolve
from unstall.errors import EmptyDatasetError, SampleError


class ShardDataset(torch.utils.data.Dataset, ShardFormat):
    """Base of the sharded datasets; each subclass is one shard format (`ShardFormat`'s
    hooks, listed in `registry.formats()`).

    Args:
        source: shards: a brace pattern (``s3://b/train-{000..099}.tar``), a list of
            URLs, or a directory / prefix holding them.
        image: the field (tar extension, MDS or Parquet column) holding the image,
            ``;``-separated alternatives; None: samples are dicts of every field.
        label: the integer label's field, or None.
        transform: applied to the image bytes (e.g. `unstall.ImagePipeline`), or to
            the dict when ``image=None``.
        shuffle: ``"full"`` (with the loader's ``shuffle=True``: a permutation of the
            whole dataset each epoch) or ``"window"`` (shards in a new order each
            epoch, samples shuffled within windows of ``window`` shards).
        window: shards per window for ``shuffle="window"`` (and the first epoch's windows).
        first_epoch: the order of epoch 0 with ``shuffle="full"``: ``"window"`` (shards in
            download order, samples permuted within windows of 1, 2, 4 ... ``window``
            shards, so training starts when the first shard lands while the rest arrive),
            ``"full"`` (the full permutation: the first batch waits for every shard), or
            ``"auto"``: ``"window"`` for remote shards kept on local disk, else ``"full"``.
            A pure function of (seed, epoch) either way: exact resume and exactly once hold.
        beside_index: use index objects stored beside the shards (`unstall index URL`).
        disk: local bytes for whole remote shards (``"auto"``: min(dataset + 10 %,
            half the free space, free space - 10 GiB)); a dataset larger is read with
            coalesced range GETs. Ignored for local shards.
        store_options: for ``s3://``: ``endpoint``, ``region``, ``config``, ...
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Sequence[str],
        *,
        image: str | None = "default",
        label: str | None = "default",
        transform: Callable[[Any], Any] | None = None,
        shuffle: str = "full",
        window: int = 8,
        disk: int | str = "auto",
        first_epoch: str = "auto",
        beside_index: bool = True,
        **store_options: Any,
    ):
        if shuffle not in order.MODES:
            raise ValueError(f"shuffle={shuffle!r} must be one of {', '.join(order.MODES)}")
        if window < 1:
            raise ValueError(f"window={window} must be >= 1 shard")
        if first_epoch not in ("auto", "window", "full"):
            raise ValueError(f"first_epoch={first_epoch!r} must be 'auto', 'window' or 'full'")
        root, keys = resolve(source, self.suffixes)
        self.location = Location(root, **store_options)
        self.image = self.default_image if image == "default" else image
        self.label = self.default_label if label == "default" else label
        self.transform = transform
        self.shuffle_mode, self.window, self.beside_index = shuffle, window, beside_index
        self.files: ShardFiles | None = None
        if self.location.remote:
            self.files = ShardFiles(self.location.url)
        # the LIST, and each shard's index (stored, or built now and saved per shard)
        infos = survey.survey(self, keys, disk)
        auto = self.location.remote and self.keep
        self.first_window = self.shuffle_mode == "full" and (
            auto if first_epoch == "auto" else first_epoch == "window"
        )
        #: tar shards not indexed yet, kept on local disk, epoch 0 in windows: each is indexed
        #: as it lands, in the background; the first batch waits for the first shard only
        self._defer = self.lazy_index and self.first_window and auto
        infos, tables = self.shard_tables(
            infos, lambda chosen: survey.gather(self, chosen, defer=self._defer)
        )
        self.location.listed = {}  # the whole listing: not carried into workers
        self._growth = growing.Growth(self, infos, tables)
        self._growth.start()
        if self.length_known and len(self.index) == 0:
            raise EmptyDatasetError(f"the shards under {self.location.url!r} hold no samples")
        self.check_fields()
        self._set_spans()

    def _set_spans(self) -> None:
        #: Raw bytes of a sample: its whole span, or (``direct``) only its image, with the
        #: label from the index: no copy in ``prepare``, fewer bytes read (`direct_spans`).
        self.spans, self.direct_labels = self.direct_spans()
        self.direct = self.direct_labels is not None

    def index_grew(self) -> None:
        """The index covers more shards now (`growing`): what was derived from it again."""
        self.__dict__.pop("_versions", None)
        self._set_spans()

    @property
    def length_known(self) -> bool:
        """Whether every shard is indexed (the sample count known): while False, ``len()``
        first indexes the rest (`complete`); `unstall.DataLoader` streams epoch 0 instead."""
        return self._growth.complete

    def complete(self) -> None:
        """Index every shard not indexed yet, now (shown with a progress bar); ``len()``,
        ``fingerprint()`` and a cache ask for it. Each shard's index is saved as it is done."""
        if not self.length_known:
            self._growth.finish()
            if len(self.index) == 0:
                raise EmptyDatasetError(f"the shards under {self.location.url!r} hold no samples")

    def _cover(self, index: int) -> None:
        """Make the index reach sample ``index`` (a worker: from the index files the main
        process's shards left; else by indexing every shard, `complete`)."""
        if index >= len(self.index) and not self.length_known:
            self._growth.advance()
            if index >= len(self.index):
                self.complete()

    # Index ------------------------------------------------------------------------------
    def publish_index(self) -> int:
        """Write each shard's index beside the shards (``_unstall_index/<format>/``), so other
        nodes and later runs read no shard to index it (`unstall index URL`); returns the
        number of index objects written. The store must be writable."""
        self.complete()
        return survey.publish(self)

    def check_fields(self) -> None:
        """Fail at construction, naming the fields there are, when image or label is absent."""
        have = set(self.index.fields)
        if not have:
            return
        for what, want in (("image", self.image), ("label", self.label)):
            if want is not None and not have & set(want.split(";")):
                raise ValueError(
                    f"{what}={want!r}: no such field in the shards under "
                    f"{self.location.url!r}; fields: {', '.join(sorted(have))}"
                )

    # Dataset ----------------------------------------------------------------------------
    def __len__(self) -> int:
        self.complete()
        return len(self.index)

    def shard_of(self, index: int) -> ShardInfo:
        self._cover(index)
        return self.index.shards[int(self.index.sample_shard[index])]

    def key(self, index: int) -> str:
        """``<shard>:<sample key>``: names the sample in errors and in shared caches."""
        return f"{self.shard_of(index).key}:{self.index.keys[index]}"

    def fingerprint(self) -> str:
        """Identifies the data: format, location and layout (`ShardIndex.fingerprint`)."""
        self.complete()
        digest = hashlib.blake2b(f"{self.kind}\0{self.location.url}\0".encode(), digest_size=16)
        digest.update(self.index.fingerprint().encode())
        digest.update(b"image-only" if self.direct else b"whole-sample")  # what raw bytes hold
        return digest.hexdigest()

    def versions(self) -> np.ndarray:
        """Each sample's version (int64): its shard's size and ETag or mtime, hashed, so a
        cache that outlives a rewrite (``Cache(name=...)``, kept segments) never serves it."""
        self.complete()
        if getattr(self, "_versions", None) is None:
            from unstall.stores.listing import etag_versions

            shards = self.index.shards
            sizes = np.array([s.size for s in shards], dtype=np.int64)
            per_shard = etag_versions(sizes, [s.version for s in shards])
            self._versions = per_shard[self.index.sample_shard]
        return self._versions

    def raw_sizes(self, indices: Sequence[int]) -> np.ndarray:
        """Bytes `fetch` gives for each of ``indices``, from the index: a cache sizes itself
        without reading a sample (16 reads per job before; range GETs on S3)."""
        if len(indices):
            self._cover(int(np.max(indices)))
        spans = self.spans[np.asarray(indices, dtype=np.int64)]
        return spans[:, 1] - spans[:, 0]

    def fetch(self, indices: Sequence[int]) -> list[bytes]:
        """Raw bytes (the shard span) of each sample, in order."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size:
            self._cover(int(idx.max()))
        if idx.size and (idx.min() < 0 or idx.max() >= len(self.index)):
            bad = int(idx[(idx < 0) | (idx >= len(self.index))][0])
            raise IndexError(f"sample index {bad} out of range for {len(self.index)} samples")
        shards = self.index.sample_shard[idx].tolist()
        spans = self.spans[idx].tolist()
        infos = self.index.shards
        if not self.location.remote:
            return [
                self.location.pread_local(infos[s], a, b)
                for s, (a, b) in zip(shards, spans, strict=True)
            ]
        if self.keep or self.windowed:
            assert self.files is not None
            needed = [infos[s] for s in dict.fromkeys(shards)]
            self.files.open(self.location, needed)  # open: another worker may evict them
            out = [
                self.files.pread(infos[s], a, b) for s, (a, b) in zip(shards, spans, strict=True)
            ]
            if self.windowed:  # open descriptors keep an evicted file readable
                self.files.evict(self.disk_budget, keep=needed)
                self.files.release(keep=needed)
            return out
        return fetch_ranges(self, shards, spans)

    #: the loader names each worker's next batch (`prefetch`): window mode fetches its shards
    prefetches = True

    def prefetch(self, indices: Sequence[int]) -> None:
        """Start copying the shards of upcoming samples (remote shards kept or windowed; a
        hint, never raises)."""
        if self.files is not None and (self.windowed or self.keep) and len(indices):
            self._cover(int(max(indices)))
            self._growth.prefetch(indices)

    def prepare(self, index: int, raw: bytes) -> Any:
        """``(transform(image), label)``, ``transform(image)``, or the dict of fields."""
        if self.direct:  # raw is the image itself; the label was read into the index
            label = int(self.direct_labels[index])  # type: ignore[index]
            if label == -2:  # `tar.NO_IMAGE`: a shard indexed after the choice lacks one
                raise self._error(index, f" has no field {self.image!r}")
            x = self._transform(index, raw)
            if self.label is None:
                return x
            if label < 0:
                raise self._error(
                    index, f": its {self.label!r} field is missing or not a non-negative integer"
                )
            return x, label
        with self._failing(index, "cannot read", keep=(SampleError,)):
            fields = (
                self.fields(index, raw) if self.image is None else self.wanted_fields(index, raw)
            )
        if self.image is None:
            return self._transform(index, fields)
        x = self._transform(index, self._pick(index, fields, self.image))
        if self.label is None:
            return x
        value = self._pick(index, fields, self.label)
        try:
            label = int(value if not isinstance(value, (bytes, memoryview)) else bytes(value))
        except (TypeError, ValueError) as exc:
            raise self._error(
                index,
                f": label field {self.label!r} holds {bytes(value)[:40]!r}, not an integer"
                if isinstance(value, (bytes, memoryview))
                else f": label {value!r} is not an integer",
            ) from exc
        return x, label

    def _error(self, index: int, what: str, *, verb: str = "") -> SampleError:
        """The `SampleError` of sample ``index``: ``"[verb ]sample I (KEY)<what>"``, with its
        index and key."""
        key = self.key(index)
        lead = f"{verb} sample" if verb else "sample"
        return SampleError(f"{lead} {index} ({key}){what}", index=index, key=key)

    @contextlib.contextmanager
    def _failing(
        self, index: int, verb: str, *, keep: tuple[type[Exception], ...] = ()
    ) -> Iterator[None]:
        """A failure of the body becomes sample ``index``'s `SampleError` (``"<verb> sample I
        (KEY): Type: message"``); the ``keep`` kinds pass through as they are."""
        try:
            yield
        except keep:
            raise
        except Exception as exc:
            raise self._error(index, f": {type(exc).__name__}: {exc}", verb=verb) from exc

    def _pick(self, index: int, fields: dict[str, Any], names: str) -> Any:
        for name in names.split(";"):
            if name in fields:
                return fields[name]
        have = ", ".join(sorted(fields)) or "none"
        raise self._error(index, f" has no field {names!r}; it has {have}")

    def _transform(self, index: int, x: Any) -> Any:
        if self.transform is None:
            return x
        with self._failing(index, "cannot prepare"):
            return self.transform(x)

    def __getitem__(self, index: int) -> Any:
        return self.prepare(index, self.fetch([index])[0])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        raws = self.fetch(indices)
        return [self.prepare(i, raw) for i, raw in zip(indices, raws, strict=True)]

    # Order ------------------------------------------------------------------------------
    def epoch_order(self, seed: int, epoch: int) -> np.ndarray | None:
        """The order of a shuffled epoch: None (the loader's full permutation), the
        shard-window order (``shuffle="window"``), or for epoch 0 of remote shards still
        arriving (``first_epoch``) windows of 1, 2, 4 ... shards in download order.

        Asked by the loader as each epoch starts: shards not yet local are then downloaded
        in the background in the order this epoch needs them.
        """
        if self.shuffle_mode == "window":
            self.complete()
            out = order.window_order(self.index.shard_first, self.window, seed=seed, epoch=epoch)
        elif self.first_window and epoch == 0:
            if not self.length_known:  # streamed, window by window, as the shards are indexed
                self._download_ahead(None)
                n, growth = len(self._growth.infos), self._growth
                return order.Streamed(
                    lambda: order.first_epoch_windows(
                        n, self.window, seed=seed, epoch=epoch, shard_first=growth.shard_first
                    )
                )
            out = order.first_epoch_order(
                self.index.shard_first, self.window, seed=seed, epoch=epoch
            )
        else:
            out = None  # the loader's permutation: it asks len() (every shard indexed) first
        self._download_ahead(out)
        return out

    def _download_ahead(self, samples: np.ndarray | None) -> None:
        """Remote shards kept on local disk: downloaded in the background in the order
        ``samples`` need them (`growing.Growth.ahead`)."""
        if self.keep and self.files is not None:
            self._growth.ahead(samples)

    # Stats ------------------------------------------------------------------------------
    def mode(self) -> str:
        """How samples are read: local files, whole shards on local disk, or range GETs."""
        return report.mode(self)

    def stats(self) -> dict[str, Any]:
        """``{"shards": ...}``: format, read mode, shuffle mode and its cost, requests."""
        return report.stats(self, self._growth)
