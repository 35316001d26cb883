"""unstall: find and remove data stalls in PyTorch training."""

from unstall.data import FileDataset, ImageFolder
from unstall.errors import SampleError, StoreError
from unstall.loader import DataLoader
from unstall.loader.swap import patch_torch
from unstall.stores import Store, open_store

__version__ = "0.1.0"


def __getattr__(name: str):  # lazy: heavier modules load on first use
    if name == "ImagePipeline":
        from unstall.pipeline import ImagePipeline

        return ImagePipeline
    if name == "analyze":
        from unstall.analysis import analyze

        return analyze
    if name == "Cache":
        from unstall.cache import Cache

        return Cache
    if name == "Peers":
        from unstall.distributed import Peers

        return Peers
    raise AttributeError(f"module 'unstall' has no attribute {name!r}")


__all__ = [
    "Cache",
    "DataLoader",
    "FileDataset",
    "ImageFolder",
    "ImagePipeline",
    "Peers",
    "SampleError",
    "Store",
    "StoreError",
    "analyze",
    "open_store",
    "patch_torch",
]
