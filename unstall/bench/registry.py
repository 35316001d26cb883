"""The named benchmarks: name -> module, and loading one by name."""

from __future__ import annotations

import importlib
from types import ModuleType

BENCHMARKS: dict[str, str] = {
    "overhead": "unstall.bench.overhead",
    "local": "unstall.bench.local",
    "cache": "unstall.bench.cache",
    "s3": "unstall.bench.s3",
    "prep": "unstall.bench.prep",
    "train": "unstall.bench.train",
    "hpsearch": "unstall.bench.hpsearch",
    "whatif": "unstall.bench.whatif",
    "distributed": "unstall.bench.distributed",
    "listing": "unstall.bench.listing",
    "launch": "unstall.bench.launch",
    "shards": "unstall.bench.shards",
    "filecache": "unstall.bench.filecache",
    "autotune": "unstall.bench.autotune",
    "torchvision": "unstall.bench.torchvision",
}


def load(name: str) -> ModuleType:
    """The module of benchmark ``name``; names the known ones if it does not exist."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}")
    return importlib.import_module(BENCHMARKS[name])
