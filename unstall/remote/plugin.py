"""``remote=`` as a loader extension: the loader builds `RemoteWorkers` through it.

The loader never imports this package: its extension registry (`unstall.loader.extensions`)
imports this module when a loader is given ``remote=``, and this module registers the
factory. The loader then asks two things of it: a sampler for torch's workers (`split`),
which takes batches from the plan as local workers ask, and the epoch's merged iterator
(`receive`), which hands out local and remote batches in the plan's order.
"""

from __future__ import annotations

import atexit
import os
import weakref
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from unstall.loader import extensions
from unstall.remote.actor import Shipment
from unstall.remote.cluster import join
from unstall.remote.dispatch import EpochRun, Merged
from unstall.remote.pool import ActorPool
from unstall.remote.settings import Remote
from unstall.remote.stats import RemoteStats

#: Pools alive in this process: killed at exit if their loader was not collected first.
_pools: weakref.WeakSet[ActorPool] = weakref.WeakSet()


class RemoteWorkers:
    """One loader's remote workers: the cluster joined, the actors, the epoch in progress.

    Args:
        remote: a `Remote` or the dict of its fields (a config file's).
        task: the loader's `BatchTask` (its dataset and collate function are shipped).
    """

    def __init__(self, remote: Any, task: Any):
        self.settings = settings = Remote.of(remote)
        self.address = join(settings)
        import ray

        shipment = Shipment(task.dataset, task.collate_fn, task.unbatched)
        self.pool = ActorPool(settings, ray.put(shipment))
        _pools.add(self.pool)
        self.local_task = task  # prepares batches here after a fallback
        self.counters = RemoteStats()
        #: remote batches sent and not yet handed out, at most (the reorder window)
        self.window = 2 * settings.workers * settings.tasks_per_worker
        self._sampler: Any = None  # the plan (`split`)
        self._fresh: EpochRun | None = None  # made when torch iterates the sampler
        self._run: EpochRun | None = None  # the epoch being handed out
        self._waited = False  # the first epoch waited for the actors (``wait_up_s``)

    def split(self, sampler: torch.utils.data.Sampler) -> torch.utils.data.Sampler:
        """The sampler torch's workers iterate: ``sampler``'s batches, as local ones ask."""
        self._sampler = sampler
        return SplitSampler(sampler, self)

    def open_run(self, sampler: Any) -> EpochRun:
        """The next epoch's run over ``sampler`` (made once, by whichever side asks first)."""
        if self._fresh is None:
            self._fresh = EpochRun(iter(sampler), int(getattr(sampler, "start", 0)), self)
        return self._fresh

    def receive(self, torch_iter: Iterator[Any], epoch: int, start: int) -> Merged:
        """Epoch ``epoch``'s ``(batch, timing)`` pairs from batch ``start`` on, in order,
        torch's and the actors'."""
        if not self._waited and self.settings.wait_up_s > 0:
            self._waited = True
            self.pool.wait_up(self.settings.wait_up_s)
        run = self.open_run(self._sampler)
        self._fresh = None
        if self._run is not None:
            self._run.close()  # an epoch replaced before its end
        self._run = run
        run.top_up()
        return Merged(run, torch_iter)

    @property
    def workers(self) -> int:
        """The remote workers started (``Remote(workers=N)``): the most the loader uses."""
        return self.settings.workers

    @property
    def in_use(self) -> int:
        return self.pool.in_use

    def use(self, count: int) -> None:
        """Send new batches to ``count`` of the workers from now on (0 to `workers`): the
        autotuner's choice. Batches already sent finish where they are."""
        self.pool.in_use = max(0, min(int(count), self.settings.workers))

    def stats(self) -> dict[str, Any]:
        if not self.pool.closed:
            self.pool.check()  # actors up by now count as up
        out = self.counters.as_dict(self.settings.workers, self.pool.up_count(), self.address)
        out["remote"]["workers_in_use"] = self.pool.in_use
        return out

    def close(self) -> None:
        """Drop the epoch in progress and kill the actors; safe to call twice."""
        if self._run is not None:
            self._run.close()
        self.pool.close()


class SplitSampler(torch.utils.data.Sampler):
    """torch's sampler under ``remote=``: the plan's batches that local workers take."""

    def __init__(self, inner: torch.utils.data.Sampler, owner: RemoteWorkers):
        self.inner = inner
        self.owner = owner

    def __iter__(self) -> Iterator[Any]:
        return self.owner.open_run(self.inner).local_batches()

    def __len__(self) -> int:
        return len(self.inner)  # type: ignore[arg-type]


@atexit.register
def _kill_all() -> None:
    for pool in list(_pools):
        if pool.owner_pid == os.getpid():
            pool.close()


extensions.register("remote", RemoteWorkers)
