"""Building a map-style loader's machinery: order, batch tasks, slots, device wiring.

`build_machinery` turns the user's arguments into the parts `DataLoader` runs:
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

from unstall.loader.fetch import BatchTask, FetchLayer
from unstall.loader.on_device import declared_batch_bytes, default_device_transform, plan_prep
from unstall.loader.sampling import OrderSpec, PlanSampler, UserBatchSampler
from unstall.loader.slot_handoff import SlotHandoff, SlotSampler
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
    coordination: Any = None  # issue 18: unstall.coordination.Coordination, or None


def build_machinery(owner: Any, dataset: Any, a: dict[str, Any], device: Any) -> Machinery:
    """Everything a map-style loader runs, from its arguments ``a`` (torch's and unstall's).

    ``owner`` (the loader) only anchors the slots' finalizer: they are freed with it.
    """
    batch_size, sampler, batch_sampler = a["batch_size"], a["sampler"], a["batch_sampler"]
    num_workers = a["num_workers"]
    unbatched = batch_size is None and batch_sampler is None
    order: OrderSpec | None = None
    if batch_sampler is not None or sampler is not None:
        if batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size or 1, a["drop_last"])
        plan: PlanSampler | UserBatchSampler = UserBatchSampler(batch_sampler)
    else:
        order = OrderSpec(
            num_samples=len(dataset),
            batch_size=batch_size or 1,
            shuffle=bool(a["shuffle"]),
            drop_last=a["drop_last"],
            seed=a["seed"] if a["seed"] is not None else 0,
            rank=a["rank"],
            world_size=a["world_size"],
            permute=getattr(dataset, "epoch_order", None),
            # a dataset with its own epoch order (shards) is never torch's order
            rule="seeded" if a["seed"] is not None or hasattr(dataset, "epoch_order") else "torch",
        )
        plan = PlanSampler(
            order, lookahead=_lookahead(dataset, num_workers), generator=a["generator"]
        )

    collate_fn = a["collate_fn"]
    if collate_fn is None:
        collate_fn = (
            torch.utils.data.default_convert if unbatched else torch.utils.data.default_collate
        )
    device_transform = a["device_transform"]
    if device_transform is not None and (device is None or not callable(device_transform)):
        raise ValueError(
            f"device_transform={device_transform!r} needs a callable and a device: "
            "pass device='cuda' (or 'cpu') with it"
        )
    prep, task_dataset, collate_fn, gpu_prep = plan_prep(
        a["prep"], dataset, device, collate_fn, batch_size=batch_size, num_workers=num_workers
    )
    if callable(getattr(gpu_prep, "close", None)):
        weakref.finalize(owner, gpu_prep.close)  # e.g. DALI's threads and device buffers
    pin_memory = a["pin_memory"]
    zero_copy = check_zero_copy(a["zero_copy"], num_workers, pin_memory and device is None)
    zero_copy = zero_copy and not unbatched
    coordination = None
    if a.get("coordinate"):  # issue 18: published batches are mapped, not sent through slots
        from unstall.loader import extensions

        coordination = extensions.get("coordinate")(a["coordinate"], dataset, order, prep)
        weakref.finalize(owner, coordination.close)
        zero_copy = False
    if device is not None or zero_copy:
        pin_memory = False  # the device stage pins (slots are page-locked once)
    fetch_layer: FetchLayer | None = None
    if a["cache"] is not None or callable(getattr(dataset, "fetch", None)):
        # None: a disk tier for remote data; False: none (a plain dataset loads no cache code)
        from unstall.cache.tiers import bind_cache

        fetch_layer = bind_cache(a["cache"], dataset)
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
    if zero_copy:
        depth = (a["prefetch_factor"] or 2) * num_workers + 4
        cuda = device is not None and device.type == "cuda"
        declared = declared_batch_bytes(dataset, batch_size, prep)
        handoff = SlotHandoff(depth, batch_bytes=declared, cuda_register=cuda)
        weakref.finalize(owner, handoff.close)
        torch_sampler = SlotSampler(plan, handoff)
    if device_transform is None and device is not None:
        device_transform = default_device_transform(dataset, prep)
    generator = a["generator"]
    # With unstall's seed and no user generator, workers' seeds follow (seed, epoch, rank)
    # (see DataLoader.__iter__); otherwise torch draws them, from the generator or its global one.
    seeded = a["seed"] is not None
    worker_seeds = torch.Generator() if generator is None and seeded else None
    extra: dict[str, Any] = {} if a["in_order"] else {"in_order": False}
    prefetch = a["prefetch_factor"]
    if coordination is not None and num_workers > 0:  # issue 18: tasks of published batches
        prefetch = coordination.prefetch_factor(prefetch, num_workers)  # cost nothing in flight
    inner = TorchDataLoader(
        task if coordination is None else coordination.wrap(task, (prefetch or 1) * num_workers),
        batch_size=None,
        sampler=torch_sampler,
        num_workers=num_workers,
        collate_fn=_identity,
        pin_memory=pin_memory,
        timeout=a["timeout"],
        worker_init_fn=a["worker_init_fn"],
        multiprocessing_context=a["multiprocessing_context"],
        generator=generator if worker_seeds is None else worker_seeds,
        prefetch_factor=prefetch,
        persistent_workers=a["persistent_workers"],
        pin_memory_device=a["pin_memory_device"],
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
        stats_sources=sources + ([coordination.stats] if coordination is not None else []),
        coordination=coordination,
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


def check_zero_copy(zero_copy: bool | None, num_workers: int, host_pinning: bool) -> bool:
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
