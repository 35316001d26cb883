"""Datasets the remote tests ship to Ray actors (pickled by value: see conftest.py)."""

from __future__ import annotations

import random
import time

import numpy as np
import torch


class Noisy(torch.utils.data.Dataset):
    """Sample ``i``: its index, and draws from torch, numpy and `random` (the batch's seed
    decides them); ``sleep_s`` a sample, the cost of a slow disk; ``bad``: an index that fails."""

    def __init__(self, n: int = 64, sleep_s: float = 0.0, bad: int | None = None):
        self.n, self.sleep_s, self.bad = n, sleep_s, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == self.bad:
            raise ValueError(f"sample {i} is corrupt")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        noise = torch.rand(3, 4, 4) + float(np.random.rand()) + random.random()
        return {"index": i, "x": noise + i}


class NotOnTheNodes(Noisy):
    """Unpickles nowhere but here: the nodes lack what it needs (as a missing module would)."""

    def __setstate__(self, state):
        raise ImportError("No module named 'codec_only_here'")
