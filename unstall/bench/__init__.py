"""Named benchmarks, each comparing torch's DataLoader and unstall in the same run.

Every module here has ``DESCRIPTION`` (one line) and
``run(*, quick: bool, console) -> BenchResult``.

Names load on first use: ``unstall --help`` and ``unstall bench --help`` list the benchmarks
from `unstall.bench.registry` without importing torch (3 s of CPU before).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from unstall.lazy import homes_of, lazy_exports

_HOMES = homes_of(
    {
        "unstall.bench.harness": "BenchResult Measurement measure print_result write_json",
        "unstall.bench.registry": "BENCHMARKS load",
        "unstall.models.simulated": "MODEL_RATES SimulatedAccelerator",
    }
)

__getattr__, __dir__ = lazy_exports(__name__, _HOMES)

if TYPE_CHECKING:
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
