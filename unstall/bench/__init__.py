"""Named benchmarks, each comparing torch's DataLoader and unstall in the same run.

Every module here has ``DESCRIPTION`` (one line) and
``run(*, quick: bool, console) -> BenchResult``.
"""

from __future__ import annotations

from unstall.bench.harness import BenchResult, Measurement, measure, print_result, write_json
from unstall.bench.registry import BENCHMARKS, load
from unstall.models.simulated import MODEL_RATES, SimulatedAccelerator

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
