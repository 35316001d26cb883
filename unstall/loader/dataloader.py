"""`unstall.DataLoader`: torch's DataLoader interface, with known order, resume and stats.

Worker processes, pinning, timeouts and worker-death detection are torch's own
(`torch.utils.data.DataLoader`, well tested): unstall hands it one task per
*batch* (a `PlanSampler` of index lists and a `BatchTask`), so storage sees whole
batches, and wraps the iterator to time the consumer's waits.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.utils.data
from torch.utils.data import BatchSampler, Sampler

from unstall.loader.device import DeviceStage, resolve_device
from unstall.loader.fetch import BatchTask, FetchLayer, SplitDataset
from unstall.loader.handoff import unpack
from unstall.loader.on_device import (
    declared_batch_bytes,
    default_device_transform,
    iterate_on_device,
    plan_prep,
)
from unstall.loader.options import resolve_seed, resolve_world, validate
from unstall.loader.sampling import OrderSpec, PlanSampler, UserBatchSampler, worker_base_seed
from unstall.loader.slot_handoff import SlotHandoff, SlotSampler
from unstall.loader.stats import LoaderStats, batch_size_of

STATE_VERSION = 1


class DataLoader:
    """A drop-in `torch.utils.data.DataLoader` for map-style datasets.

    Same arguments and behaviour as torch's where they exist, plus:

    Args:
        seed: the order of epoch ``e`` is a permutation derived only from
            ``(seed, e)``, identical across restarts and processes; workers' random
            streams (augmentation) follow ``(seed, e, rank)``. Default: drawn from
            ``generator`` if given (which then seeds workers as in torch), else 0.
        rank, world_size: this process's shard of every epoch (like
            `DistributedSampler`); default from `torch.distributed` when it is
            initialized, else one shard.
        cache: an `unstall.Cache` (or any object with ``bind(dataset)``) that serves
            raw bytes before the dataset's store is asked. Not given: a local-disk
            cache for remote (``s3://``) datasets, none for local ones; False: none.
        device: None (batches stay on the host), ``"cpu"``, ``"cuda"`` or a
            `torch.device`: batches are copied there on a side stream, one batch
            ahead, so the copy overlaps the training step.
        device_transform: a callable applied to each batch on ``device``, on the
            copy's stream. Default: `NormalizeImages` (to float, normalized with the
            pipeline's mean/std) when the dataset uses ``ImagePipeline(output="uint8")``.
        prep: ``"cpu"`` (workers decode and augment) or ``"gpu"`` (workers only fetch;
            decode, crop, flip and normalize run batched on the GPU). Default: ``"gpu"``
            when ``device`` is a GPU and the dataset uses the standard `ImagePipeline`.
        zero_copy: workers write batches into shared-memory slots the main process
            wraps without copying (default: on with workers, off with ``pin_memory``
            and no ``device``, so torch pins as before). A slot is reused only once
            nothing references its batch (and its copy to ``device`` is done), so
            kept batches stay intact; later batches then take torch's path.

    Each ``iter()`` runs one epoch: epoch numbers advance by themselves, or are
    set with `set_epoch`. `state_dict` records the position (epoch, batches
    handed out); `load_state_dict` makes the next ``iter()`` continue from there.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | None = None,
        batch_sampler: Sampler | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        cache: Any = None,
        device: str | torch.device | None = None,
        device_transform: Callable[[Any], Any] | None = None,
        prep: str | None = None,
        zero_copy: bool | None = None,
    ):
        validate(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            drop_last=drop_last,
            timeout=timeout,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
        )
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.seed = resolve_seed(seed, generator)
        self.rank, self.world_size = resolve_world(rank, world_size)

        unbatched = batch_size is None and batch_sampler is None
        if batch_sampler is not None or sampler is not None:
            if batch_sampler is None:
                batch_sampler = BatchSampler(sampler, batch_size or 1, drop_last)
            self._sampler: PlanSampler | UserBatchSampler = UserBatchSampler(batch_sampler)
            self.order: OrderSpec | None = None
        else:
            self.order = OrderSpec(
                num_samples=len(dataset),
                batch_size=batch_size or 1,
                shuffle=bool(shuffle),
                drop_last=drop_last,
                seed=self.seed,
                rank=self.rank,
                world_size=self.world_size,
            )
            self._sampler = PlanSampler(self.order, lookahead=_lookahead(dataset, num_workers))

        if collate_fn is None:
            collate_fn = (
                torch.utils.data.default_convert if unbatched else torch.utils.data.default_collate
            )
        self.device = resolve_device(device)
        if device_transform is not None and (self.device is None or not callable(device_transform)):
            raise ValueError(
                f"device_transform={device_transform!r} needs a callable and a device: "
                "pass device='cuda' (or 'cpu') with it"
            )
        self.prep, task_dataset, collate_fn, gpu_prep = plan_prep(
            prep, dataset, self.device, collate_fn
        )
        zero_copy = _check_zero_copy(zero_copy, num_workers, pin_memory and self.device is None)
        zero_copy = zero_copy and not unbatched
        if self.device is not None or zero_copy:
            pin_memory = False  # the device stage pins (slots are page-locked once)
        self.collate_fn = collate_fn
        from unstall.cache.tiers import bind_cache  # issue 20: None -> disk tier if remote

        self._fetch_layer: FetchLayer | None = bind_cache(cache, dataset)  # False: no cache
        self._stats_sources: list[Callable[[], dict[str, Any]]] = []
        for part in (self._fetch_layer, getattr(dataset, "store", None)):
            if part is not None and callable(getattr(part, "stats", None)):
                self._stats_sources.append(part.stats)
        self._task = BatchTask(
            task_dataset,
            collate_fn,
            fetch_layer=self._fetch_layer,
            unbatched=unbatched,
            pack=num_workers > 0 and not pin_memory,
            slots=bool(zero_copy),
        )
        self._unpack = self._task.pack
        self._handoff: SlotHandoff | None = None
        sampler: Sampler = self._sampler
        if zero_copy:
            depth = (prefetch_factor or 2) * num_workers + 4
            cuda = self.device is not None and self.device.type == "cuda"
            declared = declared_batch_bytes(dataset, batch_size, self.prep)
            self._handoff = handoff = SlotHandoff(depth, batch_bytes=declared, cuda_register=cuda)
            weakref.finalize(self, handoff.close)
            sampler = SlotSampler(self._sampler, handoff)
        self._gpu_prep = gpu_prep
        if device_transform is None and self.device is not None:
            device_transform = default_device_transform(dataset, self.prep)
        self._device_transform = device_transform
        self._main_cpu = [0.0, 0]  # main-process CPU seconds in the loader, batches
        # Without a user generator, workers' seeds follow (seed, epoch, rank): see __iter__.
        self._worker_seeds = torch.Generator() if generator is None else None
        extra: dict[str, Any] = {}
        if not in_order:
            extra["in_order"] = in_order
        self._torch_loader = torch.utils.data.DataLoader(
            self._task,
            batch_size=None,
            sampler=sampler,
            num_workers=num_workers,
            collate_fn=_identity,
            pin_memory=pin_memory,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator if generator is not None else self._worker_seeds,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            **extra,
        )
        self._stats = LoaderStats()
        self._next_epoch = 0
        self._pending_start = 0
        self._position: list[int] | None = None  # [epoch, batches handed out] of the last iter

    # Order ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run epoch ``epoch`` (keeps a loaded mid-epoch position)."""
        if epoch < 0:
            raise ValueError(f"epoch={epoch} must be >= 0")
        if epoch != self._next_epoch:
            self._pending_start = 0
        self._next_epoch = epoch

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` will run."""
        return self._next_epoch

    def __len__(self) -> int:
        if self.order is not None:
            return self.order.num_batches()
        return len(self._sampler.batch_sampler)  # type: ignore[union-attr,arg-type]

    def __iter__(self) -> Iterator[Any]:
        epoch, start = self._next_epoch, self._pending_start
        self._next_epoch, self._pending_start = epoch + 1, 0
        self._sampler.configure(epoch, start)
        self._position = position = [epoch, start]
        stats = self._stats
        stats.begin()
        if self._handoff is not None:
            self._handoff.begin_epoch()
        if self._worker_seeds is not None:
            base = worker_base_seed(seed=self.seed, epoch=epoch, rank=self.rank)
            self._worker_seeds.manual_seed(base)
        torch_iter = iter(self._torch_loader)  # starts workers now, so they prefetch
        if self.device is not None:
            stage = DeviceStage(
                self.device, self._device_transform, prep=self._gpu_prep, timed=stats.add_stage
            )
            return iterate_on_device(
                torch_iter,
                position,
                stats,
                stage,
                handoff=self._handoff,
                unpack_inline=self._unpack,
                main_cpu=self._main_cpu,
                on_epoch_end=lambda: stats.close_epoch(position[0], self._source_stats()),
            )
        return self._iterate(torch_iter, position, stats)

    def _iterate(
        self, torch_iter: Iterator[Any], position: list[int], stats: LoaderStats
    ) -> Iterator[Any]:
        handoff, cpu = self._handoff, self._main_cpu
        if handoff is not None and handoff.size == 0:
            handoff = None  # slots not worth it for these batches: inline unpacking only
        batch: Any = None
        try:
            while True:
                batch = None  # this frame must not keep the last batch's slot taken
                if handoff is not None:
                    handoff.reclaim()  # slots of batches nothing references any more
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    batch, (fetch_s, prep_s) = next(torch_iter)
                except StopIteration:
                    break
                if handoff is not None:
                    batch = handoff.receive(batch)
                elif self._unpack:
                    batch = unpack(batch)
                stats.wait.add(time.perf_counter() - t0)
                stats.fetch.add(fetch_s)
                stats.prep.add(prep_s)
                stats.samples += batch_size_of(batch)
                position[1] += 1
                cpu[0] += time.thread_time() - c0
                cpu[1] += 1
                yield batch
            stats.epochs_completed += 1
            stats.close_epoch(position[0], self._source_stats())
        except BaseException as exc:
            if handoff is not None and not isinstance(exc, GeneratorExit):
                handoff.retire()  # e.g. a worker died: its slots may never come back
            raise
        finally:
            stats.end()

    def close(self) -> None:
        """Free the loader's shared-memory slots now (also done when it is collected)."""
        if self._handoff is not None:
            self._handoff.close()

    # Resume --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The loader's position as JSON-safe ints: where the next batch would come from."""
        if self._position is None:
            epoch, done = self._next_epoch, self._pending_start
        else:
            epoch, done = self._position
            if done >= len(self):
                epoch, done = epoch + 1, 0
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "batches_done": done,
            "seed": self.seed,
            "num_samples": len(self.dataset),
            "batch_size": self.batch_size,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next ``iter()``: the exact remaining batches."""
        missing = {"epoch", "batches_done", "seed"} - set(state)
        if missing:
            raise ValueError(f"loader state lacks keys {sorted(missing)}; got {sorted(state)}")
        for key in ("seed", "num_samples", "batch_size", "world_size", "rank"):
            if key in state and state[key] != getattr(self, key, len(self.dataset)):
                mine = len(self.dataset) if key == "num_samples" else getattr(self, key)
                raise ValueError(
                    f"loader state has {key}={state[key]!r} but this loader has {key}={mine!r}; "
                    "resume with the same dataset, seed, batch size and world size"
                )
        self._next_epoch = int(state["epoch"])
        self._pending_start = int(state["batches_done"])
        self._position = None

    # Stats ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Timings since construction: waits (stall), fetch and prep per batch, throughput."""
        out = self._stats.as_dict()
        out["num_workers"] = self.num_workers
        cpu_s, batches = self._main_cpu
        if self._gpu_prep is not None:  # its decode + augment thread is main-process CPU too
            cpu_s += self._stats.stage_cpu_s
        out["main_cpu_s"] = round(cpu_s, 6)
        out["main_cpu_ms_per_batch"] = round(1e3 * cpu_s / batches, 4) if batches else 0.0
        if self._handoff is not None:
            out["zero_copy"] = self._handoff.stats()
        out["epoch"] = self._position[0] if self._position else self._next_epoch
        out.update(self._source_stats())
        return out

    def _source_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for source in self._stats_sources:
            out.update(source())
        return out

    def reset_stats(self) -> None:
        """Start counting afresh (e.g. after a warm-up epoch)."""
        self._stats = LoaderStats()
        self._main_cpu[:] = [0.0, 0]

    def add_stats_source(self, source: Callable[[], dict[str, Any]]) -> None:
        """Merge ``source()``'s sections into every `stats` result (used by caches, stores)."""
        self._stats_sources.append(source)


def _identity(x: Any) -> Any:
    return x


def _lookahead(dataset: Any, num_workers: int) -> int:
    """How far ahead each task names the next batch of its worker: 0 unless the store prefetches."""
    store = getattr(dataset, "store", None)
    if num_workers > 0 and getattr(store, "prefetches", False) and hasattr(dataset, "prefetch"):
        return num_workers
    return 0


def _check_zero_copy(zero_copy: bool | None, num_workers: int, host_pinning: bool) -> bool:
    """Resolve ``zero_copy``: on by default with workers, unless torch must pin host batches."""
    if zero_copy is None:
        return num_workers > 0 and not host_pinning
    if zero_copy and num_workers == 0:
        raise ValueError("zero_copy=True needs num_workers > 0 (slots carry worker batches)")
    if zero_copy and host_pinning:
        raise ValueError(
            "zero_copy=True with pin_memory=True: slot batches are not pinned; pass "
            "device='cuda' (slots are page-locked once) or zero_copy=False"
        )
    return bool(zero_copy)


__all__ = ["DataLoader", "SplitDataset"]
