"""The loader: known order, batch tasks for torch's workers, resume, stats."""

from unstall.loader.dataloader import DataLoader
from unstall.loader.fetch import BatchTask, FetchLayer, SplitDataset
from unstall.loader.sampling import OrderSpec, epoch_permutation, shard

__all__ = [
    "BatchTask",
    "DataLoader",
    "FetchLayer",
    "OrderSpec",
    "SplitDataset",
    "epoch_permutation",
    "shard",
]
