"""Sample order as a pure function of (seed, epoch, rank, world size), or torch's own.

With unstall's ``seed`` (or a shard), the order of every epoch is known in advance, so
caches, prefetchers and coordinating jobs can look ahead, and resume is "recompute,
then skip". Without them the order is torch's `RandomSampler`'s (`torch_order.py`),
drawn when the epoch starts and recorded, so resume is still "recompute, then skip".
"""

from __future__ import annotations

import math
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch.utils.data

from unstall.loader.streamed import streamed_batches
from unstall.loader.torch_order import (
    draw_key,
    draw_order,
    permutation,
    trailing_draw,
    unshuffled_key,
)


def epoch_permutation(n: int, *, seed: int, epoch: int) -> np.ndarray:
    """A permutation of ``range(n)`` that depends only on (seed, epoch)."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, epoch])))
    return rng.permutation(n)


def worker_base_seed(*, seed: int, epoch: int, rank: int) -> int:
    """torch's worker base seed for an epoch, from (seed, epoch, rank) alone.

    Workers seed their random streams (augmentation) from it, so two runs with the
    same seed augment alike, while epochs and ranks differ.
    """
    state = np.random.SeedSequence([seed, epoch, rank, 0x5EED]).generate_state(2, np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def shard(order: np.ndarray, *, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s part of an epoch's order, like `DistributedSampler`.

    Ranks take every ``world_size``-th index starting at ``rank``. When the
    length does not divide, the order is padded with its own first indices so
    that every rank sees the same number of samples (DDP needs equal step
    counts); without padding the shards never overlap.
    """
    if world_size == 1:
        return order
    per_rank = math.ceil(len(order) / world_size)
    total = per_rank * world_size
    if total > len(order):
        order = np.concatenate([order, np.resize(order, total - len(order))])
    return order[rank:total:world_size]


@dataclass(frozen=True)
class OrderSpec:
    """Everything the order of an epoch depends on (JSON-safe, part of `state_dict`)."""

    num_samples: int
    batch_size: int
    shuffle: bool
    drop_last: bool
    seed: int
    rank: int = 0
    world_size: int = 1
    #: The dataset's own order of a shuffled epoch, ``permute(seed, epoch)`` (a permutation of
    #: every index, or None for the default): e.g. a shard-window shuffle (issue 32).
    permute: Callable[[int, int], np.ndarray | None] | None = field(
        default=None, compare=False, repr=False
    )
    rule: str = "seeded"  # "torch": torch's RandomSampler order, from each epoch's draw
    #: ``num_samples`` of -1: the dataset's length is not known yet (sharded data whose shards
    #: are still being indexed: `known_len`); ``length()`` asks for it (the dataset then does
    #: whatever knowing it costs). Epochs whose order the dataset streams need no length.
    length: Callable[[], int] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size} must be >= 1")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank={self.rank} must be in [0, world_size={self.world_size})")

    def indices(self, epoch: int, draw: dict[str, Any] | None = None) -> np.ndarray:
        """This rank's sample indices for ``epoch``, in the order they are loaded.

        A dataset's own order (``permute``, e.g. a shard-window shuffle) comes first;
        ``draw``: with the torch rule, what the epoch drew (`torch_order.draw_order`).
        """
        if self.num_samples < 0:
            return self.known().indices(epoch, draw)
        own = self.permute(self.seed, epoch) if self.shuffle and self.permute else None
        if own is not None:
            order = np.asarray(own, dtype=np.int64)
            if len(order) != self.num_samples:
                raise ValueError(
                    f"the dataset's epoch_order gave {len(order)} indices for "
                    f"{self.num_samples} samples"
                )
        elif self.shuffle and self.rule == "torch":
            if draw is None:
                raise ValueError("a torch-order epoch is known only from its draw")
            order = permutation(self.num_samples, draw)
        elif self.shuffle:
            order = epoch_permutation(self.num_samples, seed=self.seed, epoch=epoch)
        else:
            order = np.arange(self.num_samples, dtype=np.int64)
        return shard(order, rank=self.rank, world_size=self.world_size)

    def known(self) -> OrderSpec:
        """This spec with the dataset's length (asked of the dataset if not known yet)."""
        if self.num_samples >= 0 or self.length is None:
            return self
        return replace(self, num_samples=self.length())

    def num_batches(self) -> int:
        """Batches per epoch on this rank."""
        if self.num_samples < 0:
            return self.known().num_batches()
        per_rank = (
            math.ceil(self.num_samples / self.world_size)
            if self.world_size > 1
            else self.num_samples
        )
        if self.drop_last:
            return per_rank // self.batch_size
        return math.ceil(per_rank / self.batch_size)

    def batches(
        self, epoch: int, start: int = 0, draw: dict[str, Any] | None = None
    ) -> Iterator[list[int]]:
        """The batches of ``epoch`` from batch number ``start`` on, as index lists.

        With the length not known yet, an order the dataset streams (``chunks()``: sharded
        data whose shards are still arriving) is cut into batches as it comes."""
        if self.num_samples < 0:
            own = self.permute(self.seed, epoch) if self.shuffle and self.permute else None
            if hasattr(own, "chunks"):
                yield from streamed_batches(own.chunks(), self, start)  # type: ignore[union-attr]
                return
            yield from self.known().batches(epoch, start, draw)
            return
        order = self.indices(epoch, draw)
        bs = self.batch_size
        for b in range(start, self.num_batches()):
            yield order[b * bs : (b + 1) * bs].tolist()


class PlanSampler(torch.utils.data.Sampler):
    """Yields index lists for the epoch and start batch set by `configure`.

    Handed to `torch.utils.data.DataLoader` as its sampler (with
    ``batch_size=None``), so each worker task is one whole batch. With
    ``lookahead=W`` (the number of workers, when the store can prefetch), each
    batch is a `Planned` list that also names batch ``b + W``: the next one torch
    will give the same worker, whose fetches can then start early.

    With the torch rule it draws as torch's `RandomSampler` under a `BatchSampler`
    (``generator``: the loader's, or None for torch's global one), at the same moments:
    the epoch's draw at its first index, the tail ``randperm`` when it runs out.
    ``draw`` is then ``(epoch, what was drawn)`` and ``tail`` ``"pending"`` or ``"done"``
    (None when the tail draws nothing: no shuffling, or torch's global RNG), for `state_dict`.
    """

    def __init__(
        self, spec: OrderSpec, lookahead: int = 0, generator: torch.Generator | None = None
    ):
        self.spec = spec
        self.lookahead = lookahead
        self.generator = generator
        self.epoch = 0
        self.start = 0
        self.draw: tuple[int, dict[str, Any]] | None = None
        self.tail: str | None = None
        self._replay: dict[str, Any] | None = None
        self._tail_done = False

    def configure(
        self,
        epoch: int,
        start: int,
        *,
        forward_epoch: bool = False,
        draw: dict[str, Any] | None = None,
        tail_done: bool = False,
    ) -> None:
        """Run ``epoch`` from batch ``start``; ``draw``: a resumed torch-order epoch's draw
        (replayed instead of drawing again); ``tail_done``: its tail was drawn already."""
        self.epoch, self.start = epoch, start
        self._replay, self._tail_done = draw, tail_done
        self.draw = self.tail = None

    def draw_tail(self) -> None:
        """The tail ``randperm`` of an epoch a checkpoint cut short of its end (resume)."""
        trailing_draw(self.spec.num_samples, self.generator)

    def __iter__(self) -> Iterator[list[int]]:
        # Each batch carries its key (seed, epoch, batch, rank): its augmentation is seeded
        # from that alone (pipeline/batch_seed.py), never from the worker that prepares it.
        spec, epoch = self.spec, self.epoch
        if spec.rule == "torch":
            keyed: Iterator[list[int]] = self._torch_batches(
                epoch, self.start, self._replay, self._tail_done
            )
        else:
            keyed = (
                planned_batch(b, None, (spec.seed, epoch, i, spec.rank))  # type: ignore[arg-type]
                for i, b in enumerate(spec.batches(epoch, self.start), self.start)
            )
        if self.lookahead <= 0:
            return keyed
        return _with_lookahead(keyed, self.lookahead)

    def _torch_batches(
        self, epoch: int, start: int, replay: dict[str, Any] | None, tail_done: bool
    ) -> Iterator[list[int]]:
        """torch's batches and draws (a generator: nothing is drawn before the first index).

        Keys only name the batch for unstall's own pipelines (``reseed=False``): a plain
        dataset sees torch's per-worker seeding, ``worker_init_fn`` included.
        """
        spec, gen = self.spec, self.generator
        n, bs = spec.num_samples, spec.batch_size
        if spec.shuffle:
            draw = replay if replay is not None else draw_order(gen)
            self.draw = (epoch, draw)
            order = permutation(n, draw, gen if replay is None else None)
            key_seed = draw_key(draw)
            if gen is not None:
                self.tail = "done" if tail_done else "pending"
        else:
            order, key_seed = np.arange(n, dtype=np.int64), unshuffled_key(gen)
        full, total = n // bs, spec.num_batches()
        for b in range(start, total):
            if b == full:  # the last, partial batch: the sampler ran out filling it
                self._tail(n, gen)
            yield planned_batch(
                order[b * bs : (b + 1) * bs].tolist(), None, (key_seed, epoch, b, 0), False
            )
        if total == full:  # the pull after the last full batch finds the sampler empty
            self._tail(n, gen)

    def _tail(self, n: int, gen: torch.Generator | None) -> None:
        if self.tail == "pending":
            trailing_draw(n, gen)
            self.tail = "done"

    def __len__(self) -> int:
        return self.spec.num_batches() - self.start


def _with_lookahead(batches: Iterator[list[int]], distance: int) -> Iterator[list[int]]:
    """Each batch as a `Planned` naming the batch ``distance`` places later (or none)."""
    pending: deque[list[int]] = deque()
    for batch in batches:
        pending.append(batch)
        if len(pending) > distance:
            first = pending.popleft()
            yield planned_batch(first, list(batch), *_key_of(first))
    while pending:
        first = pending.popleft()
        yield planned_batch(first, [], *_key_of(first))


def _key_of(batch: list[int]) -> tuple[Any, bool]:
    return getattr(batch, "key", None), getattr(batch, "reseed", True)


class Planned(list):
    """A batch's indices, plus ``ahead``: the batch this worker will be given next,
    ``key``: (seed, epoch, batch, rank), from which its augmentation is seeded, and
    ``reseed``: whether torch's, numpy's and `random`'s global generators are reseeded
    from the key too (unstall's order), or only unstall's own pipelines follow it.

    torch hands tasks to workers in turn, so with W workers the batch after
    batch ``b`` in the same worker is ``b + W``: the worker starts fetching it
    while it prepares and hands off batch ``b``. Only a hint: a wrong guess costs
    requests, never a sample.
    """

    ahead: list[int]
    key: tuple[int, int, int, int] | None  # (seed, epoch, batch, rank): seeds its augmentation
    reseed: bool

    def __reduce__(self) -> tuple[Any, ...]:
        return (planned_batch, (list(self), self.ahead, self.key, self.reseed))


def planned_batch(
    indices: list[int], ahead: list[int], key: Any = None, reseed: bool = True
) -> Planned:
    """A `Planned` batch: ``indices``, the batch ``ahead``, its ``key`` and ``reseed``."""
    batch = Planned(indices)
    batch.ahead = ahead
    batch.key = key
    batch.reseed = reseed
    return batch


class OrderView(torch.utils.data.Sampler):
    """``loader.sampler`` for a loader with a known order: the indices of the epoch the
    next ``iter()`` runs, in order (torch's loaders expose their sampler the same way)."""

    def __init__(self, loader: Any):
        # A weak reference: a loader in a reference cycle is freed only by the garbage
        # collector, which stops its queues' threads before torch's iterator can tell
        # persistent workers to exit (then a 5 s wait per worker).
        self._loader = weakref.ref(loader)

    @classmethod
    def samplers(cls, loader: Any, batch_size: int | None, drop_last: bool) -> tuple[Any, Any]:
        """``(sampler, batch_sampler)`` that ``loader`` shows: its order, batched as torch's."""
        view = cls(loader)
        if batch_size is None:
            return view, None
        return view, torch.utils.data.BatchSampler(view, batch_size, drop_last)

    def _spec(self) -> Any:
        return self._owner().order_spec()

    def _owner(self) -> Any:
        loader = self._loader()
        if loader is None:
            raise RuntimeError("this sampler's unstall.DataLoader was deleted")
        return loader

    def __iter__(self) -> Iterator[int]:
        loader = self._owner()
        return iter(loader.order_spec().indices(loader.epoch).tolist())

    def __len__(self) -> int:
        spec = self._spec()
        if spec.world_size == 1:
            return spec.num_samples
        return math.ceil(spec.num_samples / spec.world_size)


class UserBatchSampler(torch.utils.data.Sampler):
    """Batches from a user's sampler or batch sampler, skipping ``start`` batches on resume.

    Resume is exact only if the user's sampler yields the same order when
    iterated again (seeded); ``set_epoch`` is forwarded when it has one.
    """

    def __init__(self, batch_sampler: torch.utils.data.Sampler):
        self.batch_sampler = batch_sampler
        self.epoch = 0
        self.start = 0

    def configure(
        self, epoch: int, start: int, *, forward_epoch: bool = False, **_torch_order: Any
    ) -> None:
        """Skip ``start`` batches; with ``forward_epoch`` (the user called the loader's
        ``set_epoch``) also tell the user's sampler, which torch never does by itself."""
        self.epoch, self.start = epoch, start
        if not forward_epoch:
            return
        for target in (self.batch_sampler, getattr(self.batch_sampler, "sampler", None)):
            if hasattr(target, "set_epoch"):
                target.set_epoch(epoch)

    def __iter__(self) -> Iterator[list[int]]:
        for b, batch in enumerate(self.batch_sampler):
            if b >= self.start:
                yield list(batch)

    def __len__(self) -> int:
        return max(len(self.batch_sampler) - self.start, 0)  # type: ignore[arg-type]
