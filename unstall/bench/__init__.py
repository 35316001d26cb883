"""Named benchmarks, each comparing torch's DataLoader and unstall in the same run.

Every module here has ``DESCRIPTION`` (one line) and
``run(*, quick: bool, console) -> BenchResult``.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from unstall.bench.harness import BenchResult, Measurement, measure, print_result, write_json
from unstall.models.simulated import MODEL_RATES, SimulatedAccelerator

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
}


def load(name: str) -> ModuleType:
    """The module of benchmark ``name``; names the known ones if it does not exist."""
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}")
    return importlib.import_module(BENCHMARKS[name])


__all__ = [
    "BENCHMARKS",
    "MODEL_RATES",
    "BenchResult",
    "Measurement",
    "SimulatedAccelerator",
    "load",
    "measure",
    "print_result",
    "write_json",
]
