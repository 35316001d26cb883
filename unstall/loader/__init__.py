"""The loader: known order, batch tasks for torch's workers, resume, stats.

Besides `DataLoader`, what the packages above it build on: a batch task and its
failure (`BatchTask`, `TaskFailure`), planned batches (`planned_batch`: what the
workers are handed), the order (`OrderSpec`), and the zero-copy hand-off's writer and
reader (`unstall.loader.handoff`), which coordination points at its published files; and
`LoaderStuckError`, the watchdog's error for a loader stuck waiting (`unstall.loader.watchdog`).

Names load on first use: ``unstall run --config`` checks its file with
`unstall.loader.config_file` before the program starts, without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unstall.lazy import lazy_exports

_HOMES = {
    "BatchTask": "unstall.loader.fetch",
    "DataLoader": "unstall.loader.dataloader",
    "EpochPosition": "unstall.loader.position",
    "FetchLayer": "unstall.loader.fetch",
    "LoaderSettings": "unstall.loader.settings",
    "LoaderStuckError": "unstall.loader.watchdog",
    "OrderSpec": "unstall.loader.sampling",
    "SplitDataset": "unstall.loader.fetch",
    "TaskFailure": "unstall.loader.failures",
    "epoch_permutation": "unstall.loader.sampling",
    "planned_batch": "unstall.loader.sampling",
    "shard": "unstall.loader.sampling",
}


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


if TYPE_CHECKING:
    from unstall.loader.dataloader import DataLoader
    from unstall.loader.failures import TaskFailure
    from unstall.loader.fetch import BatchTask, FetchLayer, SplitDataset
    from unstall.loader.position import EpochPosition
    from unstall.loader.sampling import OrderSpec, epoch_permutation, planned_batch, shard
    from unstall.loader.settings import LoaderSettings
    from unstall.loader.watchdog import LoaderStuckError

__all__ = [
    "BatchTask",
    "DataLoader",
    "EpochPosition",
    "FetchLayer",
    "LoaderSettings",
    "LoaderStuckError",
    "OrderSpec",
    "SplitDataset",
    "TaskFailure",
    "epoch_permutation",
    "planned_batch",
    "shard",
]
