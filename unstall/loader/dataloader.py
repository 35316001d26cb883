"""`unstall.DataLoader`: torch's DataLoader, with known order, resume and stats on top.

It is a subclass of torch's class (``isinstance`` checks, ``DataLoader[T]``, frozen
attributes all behave as torch's). Every argument first builds a torch loader, so
bad options get torch's own errors and the attributes torch exposes get torch's
values. Map-style datasets then run on unstall's machinery (`build.py`): torch's
workers get one task per *batch*. Other datasets (iterable, or without a length)
run on that torch loader itself, with the training loop's waits timed.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import torch
import torch.utils.data
from torch.utils.data import IterableDataset, Sampler

from unstall.loader import hooks
from unstall.loader.autotune.controller import take_auto
from unstall.loader.build import build_machinery
from unstall.loader.position import EpochPosition, check_state, identity
from unstall.loader.sampling import OrderView
from unstall.loader.settings import (
    LoaderSettings,
    adapt,
    check_passthrough,
    loader_args,
    torch_arguments,
)
from unstall.loader.stats import CpuMeter, LoaderStats, loader_stats
from unstall.loader.torch_class import TorchDataLoader
from unstall.loader.workers import torch_iter
from unstall.loader.workers.epoch_start import EpochStarter, passthrough_epoch

T_co = TypeVar("T_co", covariant=True)


class DataLoader(TorchDataLoader[T_co]):  # type: ignore[misc,valid-type]
    """A drop-in `torch.utils.data.DataLoader`: same arguments, same behaviour, plus:

    Args:
        seed: the order of epoch ``e`` is a permutation derived only from
            ``(seed, e)``, identical across restarts and processes; batch ``b``'s
            random draws (torch, numpy, `random`) are seeded from ``(seed, e, b, rank)``
            alone, whichever worker or job prepares it (so ``num_workers`` does not change
            them). Default, without ``rank``/``world_size``/``coordinate``: torch's order and
            draws exactly (docs/guide/loader.md, "What differs from torch"); with them:
            ``torch.initial_seed()`` (or a draw from ``generator``), 0 with ``world_size > 1``.
        rank, world_size: this process's shard of every epoch (like
            `DistributedSampler`); default: one shard, as torch's loader.
        cache: an `unstall.Cache` (or any object with ``bind(dataset)``) that serves
            raw bytes before the dataset's store is asked; a size (``"16GiB"``) is
            ``unstall.Cache(size)``, a RAM tier of that size. Not given: a local-disk
            cache for remote (``s3://``) datasets, none for local ones; False: none.
            A dataset that opens its files itself (no ``fetch``/``key``/``fingerprint``,
            map-style or iterable) has its whole-file ``open(path, "rb")`` reads of the
            files it lists served from the cache in its workers (`unstall.loader.file_hook`).
        device: None (batches stay on the host), ``"cpu"``, ``"cuda"`` or a
            `torch.device`: batches are copied there on a side stream, one batch
            ahead, so the copy overlaps the training step.
        device_transform: a callable applied to each batch on ``device``. Default:
            `NormalizeImages` when the dataset uses ``ImagePipeline(output="uint8")``.
        prep: ``"cpu"`` (workers decode and augment), ``"gpu"`` (workers fetch and draw
            crops; a GPU stage, DALI where installed, decodes, crops, flips and
            normalizes whole batches), ``"hybrid"`` (both on every batch, the CPU share
            following both sides' measured rates) or ``"auto"`` (measures, then settles
            on one of the three; ``stats()["prep_plan"]`` says which); ``"lean"`` and these
            on a torchvision ImageFolder run its transform as unstall's (`unstall.adapt`).
            Default: ``"auto"`` on a GPU with the standard pipeline, else ``"cpu"``.
        zero_copy: workers write batches into shared-memory slots the main process
            wraps without copying (default: on with workers, off with ``pin_memory``
            and no ``device``, so torch pins as before).
        coordinate: a group name (or True: named from the dataset's fingerprint).
            Loaders on this node in the same group prepare each batch once and share
            it through shared memory (see docs/guide/sweeps.md).
        remote: an `unstall.Remote`: Ray actors on other machines prepare the batches local
            workers cannot, with the same order and draws (docs/guide/remote.md).
        num_workers, prefetch_factor: as torch's, or ``"auto"``: the loader starts small
            and changes its pool between batches while it runs (`unstall.loader.autotune`;
            ``stats()["autotune"]`` says what it chose and why).
        watchdog_s: a wait for a batch this long with no worker making progress raises
            `LoaderStuckError`, naming the stuck worker and batch
            (`unstall.loader.workers.watchdog`).

    Each ``iter()`` runs one epoch: epoch numbers advance by themselves, or are set
    with `set_epoch`. `state_dict` records the position; `load_state_dict` makes the
    next ``iter()`` continue from there. Extra keyword arguments can also come from
    the JSON file named by ``$UNSTALL_CONFIG`` (what ``unstall run --config`` sets).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Sampler | None = None,
        batch_sampler: Sampler | None = None,
        num_workers: int | str = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | str | None = None,
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
        coordinate: str | bool | None = None,
        remote: Any = None,
        watchdog_s: float | None = None,
    ):
        hooks.first_loader()  # `unstall run` / analyze start watching a script's own loaders
        args = loader_args(
            {  # as given (by name), $UNSTALL_CONFIG's kwargs over them
                "batch_size": batch_size,
                "shuffle": shuffle,
                "sampler": sampler,
                "batch_sampler": batch_sampler,
                "num_workers": num_workers,
                "collate_fn": collate_fn,
                "pin_memory": pin_memory,
                "drop_last": drop_last,
                "timeout": timeout,
                "worker_init_fn": worker_init_fn,
                "multiprocessing_context": multiprocessing_context,
                "generator": generator,
                "prefetch_factor": prefetch_factor,
                "persistent_workers": persistent_workers,
                "pin_memory_device": pin_memory_device,
                "in_order": in_order,
                "seed": seed,
                "rank": rank,
                "world_size": world_size,
                "cache": cache,
                "device": device,
                "device_transform": device_transform,
                "prep": prep,
                "zero_copy": zero_copy,
                "coordinate": coordinate,
                "remote": remote,
                "watchdog_s": watchdog_s,
            }
        )
        dataset, args = adapt(dataset, args)  # prep='lean' on torchvision's (unstall.adapt)
        self.watchdog_s = args.watchdog_s  # read by each epoch's watchdog (None: default)
        iterable = isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__")
        auto = take_auto(args.num_workers, args.prefetch_factor, map_style=not iterable)
        args = replace(args, num_workers=auto.num_workers, prefetch_factor=auto.prefetch_factor)
        self._autotune = auto.tuner  # None: the pool stays as started
        # torch checks the options and sets the attributes it exposes, exactly as its own.
        shadow = TorchDataLoader(dataset, **torch_arguments(args, dataset))
        torch_iter.adopt(self, shadow)  # its attributes, torch's names checked (once)
        self._stats = LoaderStats()
        self.main_cpu = CpuMeter()  # the loop thread's CPU in __next__ (its receive), batches
        self._stats_sources: list[Callable[[], dict[str, Any]]] = []
        self._position = EpochPosition()
        self._current: weakref.ref[Any] | None = None  # the last iter(): replaced by the next
        self._passthrough = iterable
        if self._autotune is not None:
            weakref.finalize(self, self._autotune.close)
            # coordinated preparation: the pool stays as started; with remote workers the
            # tuner sizes both sides (issue 45), iterable datasets run none (no tuner)
            self._autotune.enabled = not args.coordinate
        if self._passthrough:
            self._fetch_layer = None
            if args.cache is not None and args.cache is not False:  # issue 40: files cached
                from unstall.loader.file_hook import for_passthrough

                served, self._fetch_layer = for_passthrough(args.cache, dataset, shadow)
                if self._fetch_layer is not None:
                    self._stats_sources.append(self._fetch_layer.stats)
                if served:  # no extra left for `check_passthrough` to refuse
                    args = replace(args, cache=None)
            check_passthrough(dataset, args)
            self._inner = shadow
            self.seed, self.rank, self.world_size, self.device, self.prep = None, 0, 1, None, "cpu"
            self.order = self._handoff = self._gpu_prep = None
        else:
            self._settings = settings = LoaderSettings.resolve(dataset, args)
            self.seed, self.rank = settings.seed, settings.rank
            self.world_size, self.device = settings.world_size, settings.device
            m = build_machinery(self, dataset, settings)
            self.order = m.order
            self._sampler = m.sampler
            self.prep = m.prep
            self.collate_fn = m.collate_fn
            self._fetch_layer = m.fetch_layer
            self._stats_sources.extend(m.stats_sources)
            self._handoff, self._gpu_prep = m.handoff, m.gpu_prep  # the rest: the starter's
            self._coordination, self._remote = m.coordination, m.remote  # issues 18, 45
            if self._autotune is not None and m.remote is not None:
                self._autotune.bind_remote(m.remote)  # the tuner sizes both sides
            self._inner = m.torch_loader
            me = weakref.ref(self)  # the starter holds no loader: no reference cycle
            self._starter = EpochStarter(
                self,
                m,
                self._position,
                lambda: me()._stats,
                self.main_cpu,
                lambda: me()._source_stats(),
                self._autotune,
            )
            if self.order is not None and self.order.rule == "seeded":  # shows the known order
                self.sampler, self.batch_sampler = OrderView.samplers(self, batch_size, drop_last)
        torch_iter.set_initialized(self, True)
        if hooks.observed():
            hooks.notify_created(self)

    # Order ---------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Make the next ``iter()`` run epoch ``epoch`` (keeps a loaded mid-epoch position).

        A user sampler with ``set_epoch`` (e.g. `DistributedSampler`) is told too. With
        torch's order (no ``seed``) it only numbers the epoch: torch's draws pick the order.
        """
        self._position.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        """The epoch the next ``iter()`` will run."""
        return self._position.epoch

    @property
    def position(self) -> EpochPosition:
        """Where the loader stands: the next epoch, its start, the running epoch's cursor."""
        return self._position

    @property
    def passthrough(self) -> bool:
        """True where torch's own loader runs the dataset as it is (iterable, or no length)."""
        return self._passthrough

    def worker_pids(self) -> list[int]:
        """Process ids of the current iterator's workers (the analyzer reads their clocks)."""
        it = self._current() if self._current is not None else None
        return [p.pid for p in torch_iter.workers(getattr(it, "_torch_iter", None)) if p.pid]

    def order_spec(self, *, need_length: bool = True) -> Any:
        """The order spec (None: a user's sampler), following a dataset that grew or shrank."""
        n = len(self.dataset) if need_length or getattr(self.dataset, "length_known", 1) else -1
        if self.order is not None and self.order.num_samples != n:
            self.order = replace(self.order, num_samples=n)
            self._sampler.spec = self.order  # type: ignore[union-attr]
        return self.order

    def __len__(self) -> int:
        if self._passthrough:
            return len(self._inner)
        order = self.order_spec()
        if order is not None:
            return order.num_batches()
        return len(self._sampler.batch_sampler)  # type: ignore[union-attr,arg-type]

    def __iter__(self) -> Any:  # an iterator with a length, like torch's
        if hooks.observed():  # e.g. `unstall analyze`'s synthetic run
            override = hooks.iterate_override(self)
            if override is not None:
                return override
        if self._passthrough:
            self._end_previous()
            it = passthrough_epoch(self, self._inner, self._stats)
            self._current = weakref.ref(it)
            return it
        return self.start_epoch()

    def start_epoch(
        self,
        epoch: int | None = None,
        start: int | None = None,
        *,
        workers: int | None = None,
        prefetch: int | None = None,
        continues: Any = None,
    ) -> Any:
        """Start an epoch at a position: the one way a map-style loader's workers start.

        ``iter(loader)`` is ``start_epoch()``: the epoch and batch the loader's `position`
        names (a loaded state's draws replayed), on a new iterator that replaces the last.

        Args:
            epoch, start: start at batch ``start`` of ``epoch`` instead (the position moves
                there: e.g. a process that makes part of an epoch).
            workers, prefetch: a pool of ``workers`` x ``prefetch`` tasks in flight from
                now on (default: as it is).
            continues: an iterator of this loader whose epoch goes on from its next batch
                on the new workers (the autotuner's pool change; its own draws and workers'
                base seed are kept; ``epoch``/``start`` are its own).

        Returns:
            The epoch's iterator (``continues`` itself, or a new one).
        """
        self._need_map_style("start_epoch")
        if continues is not None:
            it = self._starter.carry_on(continues, workers=workers, prefetch=prefetch)
        else:
            if epoch is not None and epoch != self._position.epoch:
                self._position.set_epoch(epoch)
            if start is not None and start != self._position.start:
                self._position.start, self._position.loaded = start, None  # no loaded draw
            self._end_previous()
            it = self._starter.start(workers=workers, prefetch=prefetch)
            self._current = weakref.ref(it)
        if continues is not None or workers is not None or prefetch is not None:
            self.num_workers, self.prefetch_factor = self._starter.pool  # the pool it sized
        return it

    def _end_previous(self) -> None:
        previous = self._current() if self._current is not None else None
        if previous is not None:  # replaced: its epoch ends here (it may still be used on)
            previous.end_epoch()

    def close(self) -> None:
        """Free the loader's shared-memory slots now (also done when it is collected); a
        file-level cache or a cache point (``hold="samples"``...) leaves too, with its ``open``
        hook (a `Cache` of bytes stays bound)."""
        if self._handoff is not None:
            self._handoff.close()
        files, layer = sys.modules.get("unstall.cache.files"), getattr(self, "_fetch_layer", None)
        if files is not None and isinstance(layer, files.ItemLayer):  # loaded only where used
            layer.close()
        for part in (getattr(self, "_coordination", None), getattr(self, "_remote", None)):
            if part is not None:  # issue 18: leave the group; 45: stop the remote workers
                part.close()
        if getattr(self, "_autotune", None) is not None:
            self._autotune.close()

    # Resume --------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The loader's position as JSON-safe values: where the next batch would come from
        (with torch's order, also what the running epoch drew: see `unstall.loader.position`)."""
        self._need_map_style("state_dict")
        torch_rule = self.order is not None and self.order.rule == "torch"
        return self._position.state_dict(
            identity(self),
            length=len(self),
            sampler=self._sampler,
            torch_rule=torch_rule,
            # persistent workers: the next iter() reuses them (torch draws no base seed)
            workers_kept=torch_iter.running_iterator(self._inner) is not None,
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next ``iter()``: the exact remaining batches.

        A loader made without ``seed`` takes a saved seed (and unstall's order with it).
        """
        self._need_map_style("load_state_dict")
        torch_rule = self.order is not None and self.order.rule == "torch"
        seed_given = self._settings.seed_given
        adopt = check_state(state, identity(self), torch_rule=torch_rule, seed_given=seed_given)
        if adopt is not None:  # a saved run's seed (and unstall's order) over torch's draws
            self.seed = adopt
            if self.order is not None:
                self.order = replace(self.order, seed=adopt, rule="seeded")
                self._sampler.spec = self.order  # type: ignore[union-attr]
        self._position.load_state_dict(state)

    def _need_map_style(self, what: str) -> None:
        if self._passthrough:
            raise TypeError(
                f"{what}() needs a map-style dataset; {type(self.dataset).__name__} is iterable "
                "(or has no __len__), so its position is its own to keep"
            )

    # Stats ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Timings since construction: waits (stall), fetch and prep per batch, throughput."""
        return loader_stats(self)

    def _source_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for source in self._stats_sources:
            out.update(source())
        return out

    def reset_stats(self) -> None:
        """Start counting afresh (e.g. after a warm-up epoch)."""
        self._stats = LoaderStats()
        self.main_cpu.reset()

    def add_stats_source(self, source: Callable[[], dict[str, Any]]) -> None:
        """Merge ``source()``'s sections into every `stats` result (used by caches, stores)."""
        self._stats_sources.append(source)
