"""Datasets over stores, and the synthetic dataset writer."""

from unstall.data.files import FileDataset, ImageFolder
from unstall.data.keys import KeyTable

__all__ = ["FileDataset", "ImageFolder", "KeyTable"]
