"""Starting an epoch at a position: the one sequence behind every start of a map-style loader.

`EpochStarter` owns it, for one loader: the batch sampler configured at ``(epoch, start)``
(with torch's order, a draw replayed rather than drawn again), the zero-copy slots opened
for the epoch (at the pool's depth), the workers' base seed, torch's workers started, a
coordination group's published batches mapped from ``start``, and the workers tied to
the iterator that owns them (`worker_death.owning_workers`). Three callers run it:

* ``iter(loader)`` (`DataLoader.start_epoch` with no arguments): the loader's position
  says where (a loaded state's draws replayed), and a new `EpochIterator` is made;
* the autotuner's pool change (`autotune.pool`): the running iterator's epoch goes on from
  its next batch on a pool of another size; its draws and base seed are kept;
* any process that makes part of an epoch (``start_epoch(epoch, start)``).

An iterable dataset's epoch (torch's own machinery) starts in `passthrough_epoch`.

The starter holds the loader's parts (built once, `build.Machinery`) and reads only
the loader's public attributes (``seed``, ``rank``, ``order``, ``device``); it writes none:
the pool it sized (`EpochStarter.pool`) the loader takes into its own ``num_workers`` and
``prefetch_factor``. torch's private names are read through `torch_iter`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

from unstall.loader.build import Machinery
from unstall.loader.device import DeviceStage
from unstall.loader.handoff import slots_for
from unstall.loader.position import EpochPosition
from unstall.loader.sampling import worker_base_seed
from unstall.loader.stats import CpuMeter, LoaderStats
from unstall.loader.workers import torch_iter
from unstall.loader.workers.iterate import EpochIterator, PassthroughIterator
from unstall.loader.workers.worker_death import owning_workers, start_workers, stop_workers


class EpochStarter:
    """Starts one loader's epochs at a position (see the module's docstring).

    Args:
        loader: the `DataLoader` (its public ``seed``, ``rank``, ``order``, ``device``).
        parts: its machinery (sampler, slots, torch loader, coordination, seeds).
        position: its `EpochPosition`.
        stats, cpu: its `LoaderStats` and `CpuMeter`.
        source_stats: the sections an ended epoch records beside its figures.
        tuner: its autotuner, or None.
    """

    def __init__(
        self,
        loader: Any,
        parts: Machinery,
        position: EpochPosition,
        stats: Callable[[], LoaderStats],
        cpu: CpuMeter,
        source_stats: Callable[[], dict[str, Any]],
        tuner: Any = None,
    ):
        self._loader = weakref.ref(loader)  # the loader holds its starter
        self._parts = parts
        self._position = position
        self._stats = stats
        self._cpu = cpu
        self._source_stats = source_stats
        self._tuner = tuner

    def start(self, *, workers: int | None = None, prefetch: int | None = None) -> EpochIterator:
        """A new iterator at the epoch and batch the position names (``iter()``)."""
        loader = self._loader()
        loader.order_spec(need_length=False)  # a dataset still indexing shards: -1, it streams
        begun = self._position.begin()
        cursor, loaded = begun.cursor, begun.loaded
        m = self._parts
        if begun.draw_tail:  # the cut run stopped before its epoch's last pull
            m.sampler.draw_tail()  # type: ignore[union-attr]
        self._resize(workers, prefetch)
        m.sampler.configure(
            cursor.epoch,
            cursor.handed,
            forward_epoch=begun.forward_epoch,
            draw=loaded["draw"] if loaded else None,
            tail_done=bool(loaded and loaded["tail_done"]),
        )
        stats = self._stats()
        if m.handoff is not None:
            m.handoff.begin_epoch()
        begin = getattr(m.fetch_layer, "begin_epoch", None)
        if begin is not None:  # e.g. a cache partitioned across nodes: failed peers rejoin
            begin()
        if m.worker_seeds is not None:
            base = worker_base_seed(seed=loader.seed, epoch=cursor.epoch, rank=loader.rank)
            m.worker_seeds.manual_seed(base)
        order = loader.order
        length = None if getattr(order, "num_samples", 0) < 0 else len(m.sampler)
        # the workers prefetch from now on; they stop when the epoch's iterator goes, even
        # in a garbage collection (`owning_workers`)
        raw = start_workers(m.torch_loader, loaded)
        self._position.base_seed = torch_iter.base_seed(raw)
        source = self._receive(raw, cursor.epoch, cursor.handed)
        stage = None
        if loader.device is not None:  # batches go to the device one ahead
            transform, prep = m.device_transform, m.gpu_prep
            stage = DeviceStage(loader.device, transform, prep=prep, timed=stats.add_stage)
        source_stats = self._source_stats
        it = EpochIterator(
            loader,
            source,
            length,
            cursor,
            stats,
            handoff=m.handoff,
            unpack_inline=m.task.pack,
            cpu=self._cpu,
            on_epoch_end=lambda: stats.close_epoch(cursor.epoch, source_stats()),
            stage=stage,
            tuner=self._tuner,
            workers_iter=raw,
        )
        if self._tuner is not None:
            self._tuner.attach(loader, it, raw)
        return owning_workers(it, raw, loader)

    def carry_on(
        self, it: EpochIterator, *, workers: int | None = None, prefetch: int | None = None
    ) -> EpochIterator:
        """``it``'s epoch from its next batch on new workers (a pool change): its workers
        stop, the batches they prefetched are made again by the new ones, with the same
        draws (torch's order) and the same workers' base seed; returns ``it``."""
        m = self._parts
        stop_workers(it.workers_iter)
        inner = m.torch_loader
        # persistent workers: the next iter() keeps the new pool
        torch_iter.forget_iterator(inner, it.workers_iter)
        self._resize(workers, prefetch, retire=True)
        cursor, start = it.cursor, it.pulled
        draw, tail = getattr(m.sampler, "draw", None), getattr(m.sampler, "tail", None)
        m.sampler.configure(
            cursor.epoch,
            start,
            draw=draw[1] if draw is not None and draw[0] == cursor.epoch else None,
            tail_done=tail == "done",
        )
        if m.handoff is not None:
            m.handoff.begin_epoch()  # a new pool at the new depth (once slots have a size)
        base = self._position.base_seed  # the same workers' base seed: no new RNG draw
        raw = start_workers(inner, {"base_seed": base} if base is not None else None)
        it.run_on(self._receive(raw, cursor.epoch, start), raw)
        return owning_workers(it, raw, self._loader())

    @property
    def pool(self) -> tuple[int, int | None]:
        """The pool from the next start on: ``(num_workers, prefetch_factor)``."""
        inner = self._parts.torch_loader
        return inner.num_workers, inner.prefetch_factor

    def _resize(self, workers: int | None, prefetch: int | None, *, retire: bool = False) -> None:
        """The pool from now on: ``workers`` x ``prefetch`` (None: as it is); ``retire``:
        the running pool's slots never come back (its workers stopped): unlink them."""
        if workers is None and prefetch is None and not retire:
            return  # (with coordination torch's prefetch is not the loader's: keep both)
        m = self._parts
        inner = m.torch_loader
        workers = inner.num_workers if workers is None else workers
        prefetch = inner.prefetch_factor if prefetch is None else prefetch
        changed = (workers, prefetch) != (inner.num_workers, inner.prefetch_factor)
        inner.num_workers, inner.prefetch_factor = workers, prefetch
        if getattr(m.sampler, "lookahead", 0) > 0 and changed:
            m.sampler.lookahead = workers  # type: ignore[union-attr]
        if m.handoff is not None and (retire or changed):
            m.handoff.reclaim()
            m.handoff.retire()  # its prefetched slots never come back: unlink the pool
            m.handoff.count = slots_for(workers, prefetch)

    def _receive(self, raw: Any, epoch: int, start: int) -> Any:
        coordination, remote = self._parts.coordination, self._parts.remote
        if coordination is not None:
            raw = coordination.receive(raw, epoch, start)  # issue 18: the group's batches
        if remote is not None:  # issue 45: remote workers' batches merged in the plan's order
            raw = remote.receive(raw, epoch, start)
        return raw


def passthrough_epoch(loader: Any, inner: Any, stats: LoaderStats) -> PassthroughIterator:
    """An iterable dataset's epoch on torch's loader ``inner``, its workers started."""
    length = torch_iter.length_unasked(inner)  # only the user's len() counts (torch warns)
    raw = start_workers(inner)
    return owning_workers(PassthroughIterator(loader, raw, stats, length), raw, loader)
