"""Building a map-style loader's machinery: order, batch tasks, slots, device wiring.

`build_machinery` turns the loader's checked `LoaderSettings` into the parts `DataLoader` runs:
the batch sampler handed to torch's workers, the `BatchTask` they execute, the
zero-copy slots and the inner torch loader (always torch's real class).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils.data
from torch.utils.data import BatchSampler, Sampler

from unstall.loader import extensions
from unstall.loader.fetch import BatchTask, FetchLayer
from unstall.loader.handoff import SlotHandoff, SlotSampler, slots_for
from unstall.loader.prep_plan import declared_batch_bytes, default_device_transform, plan_prep
from unstall.loader.sampling import OrderSpec, PlanSampler, UserBatchSampler
from unstall.loader.settings import LoaderSettings
from unstall.loader.streamed import known_len
from unstall.loader.torch_class import TorchDataLoader


@dataclass
class Machinery:
    """The running parts of one map-style loader (built once, at construction)."""

    order: OrderSpec | None
    sampler: PlanSampler | UserBatchSampler
    prep: str
    collate_fn: Callable[[Any], Any]
    fetch_layer: FetchLayer | None
    task: BatchTask
    handoff: SlotHandoff | None
    gpu_prep: Any
    device_transform: Callable[[Any], Any] | None
    worker_seeds: torch.Generator | None
    torch_loader: Any
    stats_sources: list[Callable[[], dict[str, Any]]]
    coordination: extensions.Member | None = None  # issue 18: unstall.coordination
    remote: extensions.Remote | None = None  # issue 45: unstall.remote


def build_machinery(owner: Any, dataset: Any, s: LoaderSettings) -> Machinery:
    """Everything a map-style loader runs, from its settings ``s`` (checked already).

    ``owner`` (the loader) only anchors the slots' finalizer: they are freed with it.
    """
    batch_size, sampler, batch_sampler = s.batch_size, s.sampler, s.batch_sampler
    num_workers, device = s.num_workers, s.device
    unbatched = s.unbatched
    order: OrderSpec | None = None
    if batch_sampler is not None or sampler is not None:
        if batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size or 1, s.drop_last)
        plan: PlanSampler | UserBatchSampler = UserBatchSampler(batch_sampler)
    else:
        order = OrderSpec(
            num_samples=known_len(dataset),  # -1: shards still being indexed
            length=lambda: len(dataset),
            batch_size=batch_size or 1,
            shuffle=bool(s.shuffle),
            drop_last=s.drop_last,
            seed=s.seed if s.seed is not None else 0,
            rank=s.rank,
            world_size=s.world_size,
            permute=getattr(dataset, "epoch_order", None),
            # a dataset with its own epoch order (shards) is never torch's order
            rule="seeded" if s.seed is not None or hasattr(dataset, "epoch_order") else "torch",
        )
        plan = PlanSampler(order, lookahead=_lookahead(dataset, num_workers), generator=s.generator)

    collate_fn = s.collate_fn
    if collate_fn is None:
        collate_fn = (
            torch.utils.data.default_convert if unbatched else torch.utils.data.default_collate
        )
    prep, task_dataset, collate_fn, gpu_prep = plan_prep(
        s.prep, dataset, device, collate_fn, batch_size=batch_size, num_workers=num_workers
    )
    if callable(getattr(gpu_prep, "close", None)):
        weakref.finalize(owner, gpu_prep.close)  # e.g. DALI's threads and device buffers
    pin_memory, zero_copy = s.pin_memory, s.zero_copy  # decided by the settings
    coordination: extensions.Member | None = None
    if s.coordinate:  # issue 18: published batches are mapped, not sent through slots
        coordination = extensions.get("coordinate")(s.coordinate, dataset, order, prep)
        weakref.finalize(owner, coordination.close)
    fetch_layer: FetchLayer | None = s.cache.bind(dataset)  # `unstall.loader.cache_binding`
    task_dataset = s.cache.serve(fetch_layer, task_dataset)  # hold="samples": through the cache
    worker_init_fn = s.worker_init_fn
    if s.cache.files or s.cache.points:  # whole-file reads served in its workers (or none)
        from unstall.loader import file_hook

        worker_init_fn = file_hook.worker_init(fetch_layer, worker_init_fn, num_workers)
    sources: list[Callable[[], dict[str, Any]]] = []
    # a dataset with its own stats (sharded datasets, issue 32) reports them too
    own = dataset if callable(getattr(dataset, "stats", None)) else None
    for part in (fetch_layer, getattr(dataset, "store", None), own):
        if part is not None and callable(getattr(part, "stats", None)):
            sources.append(part.stats)
    task = BatchTask(
        task_dataset,
        collate_fn,
        fetch_layer=fetch_layer,
        unbatched=unbatched,
        pack=num_workers > 0 and not pin_memory and coordination is None,
        slots=bool(zero_copy),
    )
    handoff: SlotHandoff | None = None
    torch_sampler: Sampler = plan
    remote: extensions.Remote | None = None
    if s.remote:  # issue 45: local workers take the plan's batches first, actors the rest
        remote = extensions.get("remote")(s.remote, task)
        weakref.finalize(owner, remote.close)
        torch_sampler = remote.split(plan)
    if zero_copy:
        depth = slots_for(num_workers, s.prefetch_factor)
        cuda = device is not None and device.type == "cuda"
        declared = declared_batch_bytes(dataset, batch_size, prep)
        handoff = SlotHandoff(depth, batch_bytes=declared, cuda_register=cuda)
        weakref.finalize(owner, handoff.close)
        torch_sampler = SlotSampler(torch_sampler, handoff)
    device_transform = s.device_transform
    if device_transform is None and device is not None:
        device_transform = default_device_transform(dataset, prep)
    generator = s.generator
    # With unstall's seed and no user generator, workers' seeds follow (seed, epoch, rank)
    # (see DataLoader.__iter__); otherwise torch draws them, from the generator or its global one.
    worker_seeds = torch.Generator() if generator is None and s.seed is not None else None
    extra: dict[str, Any] = {} if s.in_order else {"in_order": False}
    prefetch = s.prefetch_factor
    if coordination is not None and num_workers > 0:  # issue 18: tasks of published batches
        prefetch = coordination.prefetch_factor(prefetch, num_workers)  # cost nothing in flight
    inner = TorchDataLoader(
        task if coordination is None else coordination.wrap(task, (prefetch or 1) * num_workers),
        batch_size=None,
        sampler=torch_sampler,
        num_workers=num_workers,
        collate_fn=_identity,
        pin_memory=pin_memory,
        timeout=s.timeout,
        worker_init_fn=worker_init_fn,
        multiprocessing_context=s.multiprocessing_context,
        generator=generator if worker_seeds is None else worker_seeds,
        prefetch_factor=prefetch,
        persistent_workers=s.persistent_workers,
        pin_memory_device=s.pin_memory_device,
        **extra,
    )
    return Machinery(
        order=order,
        sampler=plan,
        prep=prep,
        collate_fn=collate_fn,
        fetch_layer=fetch_layer,
        task=task,
        handoff=handoff,
        gpu_prep=gpu_prep,
        device_transform=device_transform,
        worker_seeds=worker_seeds,
        torch_loader=inner,
        stats_sources=sources + [part.stats for part in (coordination, remote) if part is not None],
        coordination=coordination,
        remote=remote,
    )


def _identity(x: Any) -> Any:
    return x


def _lookahead(dataset: Any, num_workers: int) -> int:
    """How far ahead each task names the next batch of its worker: 0 unless the store prefetches."""
    store = getattr(dataset, "store", None)
    prefetches = getattr(store, "prefetches", False) or getattr(dataset, "prefetches", False)
    if num_workers > 0 and prefetches and hasattr(dataset, "prefetch"):
        return num_workers
    return 0
