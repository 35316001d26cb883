"""A loader's arguments and settings, checked once: torch's arguments, unstall's own, and a
config file's.

`LoaderArgs` holds the arguments as given, one typed field each (`loader_args`: with a
config file's over them). The steps that decide from them return what they decide, a new
`LoaderArgs` (``dataclasses.replace``) or a small result, and `DataLoader.__init__` takes
it: the adapt step (`adapt`), ``"auto"`` (`unstall.loader.autotune.controller.take_auto`), an
iterable dataset's file cache (`unstall.loader.file_hook.for_passthrough`). torch's options
are checked by torch itself (`DataLoader` builds a torch loader from the same arguments
first, `torch_arguments`), so every bad value or combination gets torch's own error.
`LoaderSettings.resolve` then checks unstall's own options and resolves them (seed,
shard, device, zero-copy and pinning, ``cache=``: `unstall.loader.cache_binding`) into one
frozen object that the machinery is built from.

``unstall run --config FILE`` sets ``$UNSTALL_CONFIG=FILE``; every unstall loader made in
that process tree then takes the file's ``kwargs`` over the script's own
(`unstall.loader.config_file`): how a recommendation reaches an unchanged script.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.utils.data

from unstall.loader.cache_binding import CacheBinding, resolve_cache
from unstall.loader.config_file import config_overrides
from unstall.loader.device import resolve_device

#: unstall's own arguments: not for iterable datasets, which torch's machinery runs.
EXTRAS = (
    "seed",
    "rank",
    "world_size",
    "cache",
    "device",
    "device_transform",
    "prep",
    "zero_copy",
    "coordinate",
    "remote",
)
#: Values ``prep`` takes (None: chosen by device and dataset).
PREPS = ("auto", "cpu", "gpu", "hybrid")


@dataclass(frozen=True)
class LoaderArgs:
    """Every argument of `unstall.DataLoader` but its dataset, as given (see its docstring):
    torch's, then unstall's own. Not checked: torch checks its own (`torch_arguments`),
    `LoaderSettings.resolve` unstall's; ``num_workers``/``prefetch_factor`` may still be
    ``"auto"`` until `unstall.loader.autotune.controller.take_auto` has chosen the starting pool."""

    batch_size: int | None = 1
    shuffle: bool | None = None
    sampler: Any = None
    batch_sampler: Any = None
    num_workers: int | str = 0
    collate_fn: Callable[[list[Any]], Any] | None = None
    pin_memory: bool = False
    drop_last: bool = False
    timeout: float = 0
    worker_init_fn: Callable[[int], None] | None = None
    multiprocessing_context: Any = None
    generator: torch.Generator | None = None
    prefetch_factor: int | str | None = None
    persistent_workers: bool = False
    pin_memory_device: str = ""
    in_order: bool = True
    seed: int | None = None
    rank: int | None = None
    world_size: int | None = None
    cache: Any = None
    device: str | torch.device | None = None
    device_transform: Callable[[Any], Any] | None = None
    prep: str | None = None
    zero_copy: bool | None = None
    coordinate: str | bool | None = None
    remote: Any = None
    watchdog_s: float | None = None


@dataclass(frozen=True)
class LoaderSettings:
    """Every argument of a map-style `unstall.DataLoader`, checked and resolved once.

    torch's arguments are kept as given (torch checked them), but for ``pin_memory``:
    whether torch's pin-memory thread pins host batches (not with a device, whose stage
    pins, nor with slots, page-locked once). ``seed`` is the order's seed (None: torch's
    order and draws), ``rank``/``world_size`` this process's shard, ``device`` a
    `torch.device` or None, ``zero_copy`` whether batches cross in slots (never for a
    coordination group: its published batches are mapped), ``cache`` what ``cache=`` binds.
    """

    batch_size: int | None
    shuffle: bool | None
    sampler: Any
    batch_sampler: Any
    num_workers: int
    collate_fn: Callable[[list[Any]], Any] | None
    pin_memory: bool
    drop_last: bool
    timeout: float
    worker_init_fn: Callable[[int], None] | None
    multiprocessing_context: Any
    generator: torch.Generator | None
    prefetch_factor: int | None
    persistent_workers: bool
    pin_memory_device: str
    in_order: bool
    seed: int | None
    seed_given: bool
    rank: int
    world_size: int
    cache: CacheBinding
    device: torch.device | None
    device_transform: Callable[[Any], Any] | None
    prep: str | None
    zero_copy: bool
    coordinate: str | bool | None
    remote: Any = None  # issue 45: an `unstall.Remote` (or its dict), served by unstall.remote

    @property
    def unbatched(self) -> bool:
        """``batch_size=None`` without a batch sampler: samples are handed out one by one."""
        return self.batch_size is None and self.batch_sampler is None

    @classmethod
    def resolve(cls, dataset: Any, a: LoaderArgs) -> LoaderSettings:
        """Check and resolve the arguments ``a`` (torch's and unstall's, ``"auto"`` taken
        already) for ``dataset``."""
        rank, world_size = resolve_world(a.rank, a.world_size)
        unstall_order = any(v is not None for v in (a.seed, a.rank, a.world_size))
        # a dataset with its own epoch order (shards) draws its seed as torch would
        unstall_order = unstall_order or callable(getattr(dataset, "epoch_order", None))
        seed = None  # torch's order and draws (position.py)
        if a.remote and a.coordinate:
            raise ValueError(
                f"remote= and coordinate={a.coordinate!r} cannot be combined: a group shares "
                "batches on one node; pass one of them"
            )
        if unstall_order or a.coordinate or a.remote:  # remote: draws by batch key
            seed = resolve_seed(a.seed, a.generator, world_size)
        device = resolve_device(a.device)
        transform = a.device_transform
        if transform is not None and (device is None or not callable(transform)):
            raise ValueError(
                f"device_transform={transform!r} needs a callable and a device: "
                "pass device='cuda' (or 'cpu') with it"
            )
        if a.prep not in (None, *PREPS):
            raise ValueError(f"prep={a.prep!r} must be one of {PREPS} or None (choose by device)")
        num_workers: int = a.num_workers  # type: ignore[assignment]  # "auto" taken already
        host_pinning = a.pin_memory and device is None
        zero_copy = check_zero_copy(a.zero_copy, num_workers, host_pinning)
        zero_copy = zero_copy and not (a.batch_size is None and a.batch_sampler is None)
        if a.coordinate:  # issue 18: published batches are mapped, not sent through slots
            zero_copy = False
        return LoaderSettings(
            batch_size=a.batch_size,
            shuffle=a.shuffle,
            sampler=a.sampler,
            batch_sampler=a.batch_sampler,
            num_workers=num_workers,
            collate_fn=a.collate_fn,
            pin_memory=bool(host_pinning) and not zero_copy,
            drop_last=a.drop_last,
            timeout=a.timeout,
            worker_init_fn=a.worker_init_fn,
            multiprocessing_context=a.multiprocessing_context,
            generator=a.generator,
            prefetch_factor=a.prefetch_factor,  # type: ignore[arg-type]
            persistent_workers=a.persistent_workers,
            pin_memory_device=a.pin_memory_device,
            in_order=a.in_order,
            seed=seed,
            seed_given=a.seed is not None,
            rank=rank,
            world_size=world_size,
            cache=resolve_cache(a.cache, dataset),
            device=device,
            device_transform=a.device_transform,
            prep=a.prep,
            zero_copy=zero_copy,
            coordinate=a.coordinate,
            remote=a.remote,
        )


def torch_arguments(a: LoaderArgs, dataset: Any = None) -> dict[str, Any]:
    """The arguments of ``a`` that torch's own DataLoader takes (no ``shuffle`` for a dataset
    whose length is not known yet: torch's RandomSampler would ask it; unstall's order runs)."""
    out = {f.name: getattr(a, f.name) for f in fields(a) if f.name not in (*EXTRAS, "watchdog_s")}
    if out.get("shuffle") and getattr(dataset, "length_known", True) is False:
        out["shuffle"] = False
    return out


def check_passthrough(dataset: Any, a: LoaderArgs) -> None:
    """An iterable dataset (or one without a length) runs on torch's machinery: no extras."""
    given = [(k, getattr(a, k)) for k in EXTRAS]
    given = [(k, v) for k, v in given if v is not None and not (k == "cache" and v is False)]
    if given:
        raise ValueError(
            f"{given[0][0]}={given[0][1]!r} needs a map-style dataset with __len__ and "
            f"__getitem__; {type(dataset).__name__} is run by torch's own machinery"
        )


def resolve_seed(seed: int | None, generator: torch.Generator | None, world_size: int) -> int:
    """The seed of unstall's order (asked for by ``seed``, shards or ``coordinate``):
    ``seed``; else drawn from ``generator``; else ``torch.initial_seed()`` (fixed by
    ``torch.manual_seed``, new in each unseeded run); with several ranks 0, as
    `DistributedSampler`, so shards agree. Without those options torch's order is followed."""
    if seed is not None:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed={seed!r} must be a non-negative int")
        return seed
    if generator is not None:
        return int(torch.randint(0, 2**62, (), generator=generator))
    if world_size > 1:
        return 0
    return int(torch.initial_seed()) % 2**63


def resolve_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """This process's shard: explicit only (torch's DataLoader never shards by itself)."""
    if (rank is None) != (world_size is None):
        raise ValueError(f"pass both rank and world_size or neither; got {rank=}, {world_size=}")
    if rank is None or world_size is None:
        return 0, 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
    return rank, world_size


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


def loader_args(given: dict[str, Any]) -> LoaderArgs:
    """The arguments a loader runs with: ``given`` (the script's, by name: `LoaderArgs`'s
    fields), with ``$UNSTALL_CONFIG``'s kwargs over them (`unstall.loader.config_file`)."""
    return LoaderArgs(**{**given, **config_overrides()})


def adapt(dataset: Any, a: LoaderArgs) -> tuple[Any, LoaderArgs]:
    """For ``prep="lean"|"gpu"|"hybrid"|"auto"`` on a dataset unstall does not know (a
    torchvision ``ImageFolder``), the dataset the loader runs instead and the arguments it
    runs with (the ``"adapt"`` extension, `unstall.adapt.plugin.adapt_arguments`); else
    ``(dataset, a)`` as they are."""
    if a.prep in ("lean", "gpu", "hybrid", "auto"):
        from unstall.loader import extensions

        dataset, a = extensions.get("adapt")(dataset, a)
    return dataset, a
