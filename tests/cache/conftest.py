"""Fixtures for cache tests: a private segment namespace per test, checked clean afterwards."""

from __future__ import annotations

import gc
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import unstall
from unstall.cache.shm import segment


@pytest.fixture(autouse=True)
def shm_namespace(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Give each test its own segment names; fail if it leaves any file in /dev/shm."""
    namespace = f"t{os.getpid()}x{random.getrandbits(24):x}"
    monkeypatch.setenv("UNSTALL_SHM_NAMESPACE", namespace)
    prefix = segment.name_prefix()
    yield prefix
    gc.collect()  # run finalizers of loaders and caches the test dropped
    left = sorted(n for n in os.listdir(segment.shm_dir()) if n.startswith(prefix))
    for name in left:
        os.unlink(os.path.join(segment.shm_dir(), name))
    assert left == [], f"test left shared-memory files behind: {left}"


def sample_bytes(i: int, size: int) -> bytes:
    """Sample ``i``'s content: its index repeated, so any mix-up shows."""
    return (i.to_bytes(4, "little") * (size // 4 + 1))[:size]


@pytest.fixture
def make_dataset(tmp_path: Path) -> Callable[..., unstall.FileDataset]:
    """``make_dataset(n, size, vary=0)``: n files of ``size`` (+ up to ``vary``) bytes each."""

    def make(n: int, size: int = 512, vary: int = 0, sub: str = "data") -> unstall.FileDataset:
        root = tmp_path / sub
        root.mkdir(exist_ok=True)
        keys = []
        for i in range(n):
            key = f"{i:05d}.bin"
            (root / key).write_bytes(sample_bytes(i, size + (i * 7919) % (vary + 1)))
            keys.append(key)
        return unstall.FileDataset(root, keys)

    return make


def run_epochs(loader: unstall.DataLoader, epochs: int) -> list[list[bytes]]:
    """All samples of each epoch, in the order served."""
    out = []
    for _ in range(epochs):
        out.append([raw for batch in loader for raw in batch])
    return out
