"""The loader: known order, batch tasks for torch's workers, resume, stats.

Besides `DataLoader`, what the packages above it build on: a batch task and its
failure (`BatchTask`, `TaskFailure`), planned batches (`planned_batch`: what the
workers are handed), the order (`OrderSpec`), and the zero-copy hand-off's writer and
reader (`unstall.loader.handoff`), which coordination points at its published files; and
`LoaderStuckError`, the watchdog's error for a loader stuck waiting (`unstall.loader.watchdog`).
"""

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
