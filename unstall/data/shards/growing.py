"""A sharded dataset's index while its shards are still indexed: it grows shard by shard.

A fresh remote tar dataset (no index stored locally or beside the shards) cannot
know its sample count until every shard is read: a tar's index is its member
headers, spread through the whole file. Rather than read the whole dataset
before the first batch, `Growth` indexes the first shard when the dataset is
made and the others as they land: a background download in key order, each
shard indexed as it is written and its index saved at once (so a run stopped
part way resumes where it stopped, and the loader's workers find the tables).

The index covers the indexed *prefix* of shards in key order: a sample's number
is ``shard_first[shard] + position``, known once every shard before it is
indexed. Epoch 0 then goes window by window in key order (`order.first_epoch_windows`),
each window's samples numbered as its shards are indexed. ``len()`` (and anything
that needs every sample: a cache, the full permutation, ``shuffle="window"``)
waits for the rest, with a progress bar.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from unstall.data.shards import order
from unstall.data.shards.index import (
    ShardIndex,
    ShardInfo,
    ShardTable,
    index_dir,
    index_file,
    load,
)


class Growth:
    """The shards of ``ds`` and each one's table (None: not indexed yet); keeps ``ds.index``
    over the indexed prefix."""

    def __init__(self, ds: Any, infos: list[ShardInfo], tables: list[ShardTable | None]):
        self.ds = ds
        self.infos = infos
        self.tables: list[ShardTable | None] | None = list(tables)
        self.directory = index_dir(ds.location.url, ds.kind)
        self.missing_at_start = [k for k, t in enumerate(tables) if t is None]
        self.ready = -1  # shards of the indexed prefix
        self.complete = False
        self.advance()

    def advance(self, limit: int | None = None) -> None:
        """Extend the prefix over the shards indexed since (this process's, or index files
        saved by another: the main process's downloads, for a worker), up to ``limit``
        shards when given."""
        tables = self.tables
        if self.complete or tables is None:
            return
        k, n = max(self.ready, 0), len(self.infos)
        stop = n if limit is None else min(n, limit)
        while k < stop:
            if tables[k] is None:
                tables[k] = load(self.directory, self.infos[k])
                if tables[k] is None:
                    break
            k += 1
        if k == self.ready:
            return
        self.ready = k
        self.ds.index = ShardIndex(self.infos[:k], tables[:k])  # type: ignore[arg-type]
        if k == n:
            self.complete, self.tables = True, None  # the joined index holds everything now
        if hasattr(self.ds, "direct"):  # grown after construction: spans of the new samples
            self.ds.index_grew()

    def start(self) -> None:
        """When shards are left to index: every missing shard downloads in the background in
        key order, and this waits for the first one's index (the first batch needs it; a bad
        shard shows here, from `shard_first`'s own read when the background could not).

        One background download from the first shard on, not the first shard read here and
        then the others: the download gives its first shard the whole bandwidth and then
        runs ``DOWNLOADS`` at a time, so a second, separate download would start with a
        shard alone again (measured at 2 GB on 2 cores: 0.2 s with one stream in flight)."""
        if self.complete:
            return
        self.download(self.infos)
        self.shard_first(1)

    def download(self, infos: list[ShardInfo]) -> None:
        """Download ``infos``' missing shards in the background in that order, each indexed
        (and its index saved) as it lands."""
        then = None if self.complete else self.ds.on_landing(self.infos, self.directory)
        self.ds.files.start_background(self.ds.location, infos, then=then)

    def ahead(self, samples: np.ndarray | None) -> None:
        """Download the shards in the order ``samples`` need them (key order for the full
        permutation: every batch needs most shards), each indexed as it lands if it was not."""
        infos = self.infos
        shards = (
            range(len(infos))
            if samples is None
            else order.shards_in_order(self.ds.index.sample_shard, samples)
        )
        self.download([infos[s] for s in shards])

    def prefetch(self, indices: Any) -> None:
        """Copy the missing shards of upcoming samples ``indices`` in a thread, unless this
        process's background download runs (it brings them)."""
        ds = self.ds
        infos = ds.index.shards
        needed = [infos[s] for s in dict.fromkeys(ds.index.sample_shard[list(indices)].tolist())]
        missing = [i for i in needed if not ds.files.have(i)]
        if missing and not ds.files.background_running():

            def run() -> None:
                with contextlib.suppress(Exception):  # the batch's own fetch reports failures
                    ds.files.ensure(ds.location, missing)
                    if ds.windowed:  # landed after the reads' own evictions: keep the budget
                        ds.files.evict(ds.disk_budget, keep=missing)

            threading.Thread(target=run, daemon=True, name="unstall-shard-prefetch").start()

    def shard_first(self, end: int) -> np.ndarray:
        """``ds.index.shard_first`` once shards ``[0, end)`` are indexed (waits for their
        downloads; indexes any not indexed yet). The index grows to ``end`` shards here, not
        over every shard landed since (a worker's `advance` takes what it needs)."""
        self.advance(end)
        while self.ready < end and self.tables is not None:
            if self.ds.files.background_running():
                # this process's background download indexes them as they land: wait for
                # their index files (a call to the store now would queue behind it), then
                # grow the index once for the whole window
                before = self.ready
                if self._saved(end):
                    self.advance(end)
                if self.ready == before:  # (an index file of another version: not yet)
                    time.sleep(0.005)
                continue
            todo = [k for k in range(self.ready, end) if self.tables[k] is None]
            built = self.ds.build_index([self.infos[k] for k in todo], self.directory)
            for k, table in zip(todo, built, strict=True):
                self.tables[k] = table
            self.advance(end)
            break
        return self.ds.index.shard_first

    def _saved(self, end: int) -> bool:
        """Whether shards ``[ready, end)`` are indexed (a table here or an index file)."""
        tables = self.tables or []
        return all(
            tables[k] is not None or os.path.exists(index_file(self.directory, self.infos[k]))
            for k in range(self.ready, end)
        )

    def finish(self) -> None:
        """Index every shard left (``len()``), with a progress bar on a terminal."""
        with _progress(self):
            self.shard_first(len(self.infos))

    def sources(self) -> dict[str, int]:
        """How many shards' indexes came from where: stored on this node, beside the
        shards, or built by this run (so far)."""
        out = dict(self.ds.index_sources)
        tables = self.tables
        out["built"] += sum(tables is None or tables[k] is not None for k in self.missing_at_start)
        return out

    def indexed(self) -> int:
        """Shards with an index file on this node (the prefix, and any landed beyond it)."""
        return sum(os.path.exists(index_file(self.directory, i)) for i in self.infos)


@contextlib.contextmanager
def _progress(growth: Growth) -> Iterator[None]:
    """A rich progress bar of shards indexed while the body runs (stderr on a terminal)."""
    if not sys.stderr.isatty():
        yield
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    total = len(growth.infos)
    bar = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task(f"unstall: indexing the shards of {growth.ds.location.url}", total=total)
    done = threading.Event()

    def poll() -> None:
        while not done.wait(0.25):
            bar.update(task, completed=growth.indexed())

    with bar:
        thread = threading.Thread(target=poll, daemon=True, name="unstall-index-progress")
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()
