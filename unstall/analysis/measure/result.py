"""What the measure stage hands on: the runs as measured, and the facts of the job.

Nothing here is derived: the rates stage (`unstall.analysis.rates`) reads it and never
asks the measure stage anything more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unstall.analysis.measure.machine import Machine
from unstall.analysis.measure.probe import StorageProbe
from unstall.analysis.measure.runs import Run


@dataclass
class Measurement:
    """One job measured: the differential runs and the settings they ran with.

    Attributes:
        workload: the job's name (the built-in workload's, or the script's command).
        mode: ``"workload"`` (runs in this process) or ``"script"`` (an unchanged script).
        runs: ``synthetic``, ``cached``, ``cold`` (and ``fetch`` when storage was probed).
        probe: storage's bandwidth and latency (a dataset with ``fetch``/``prepare``).
        num_workers, batch_size, num_samples: the loader as it ran.
        machine: the node: cores, room for a cache, GPU decode.
        split: fetch and prepare were timed apart (``fetch``/``prepare`` dataset).
        cached_how: how the cached run's samples were in memory.
        notes: how it was measured, for the report.
        cached_hit_rate: the cached run's hit rate in unstall's cache.
        docs: a script's documents per mode (its agent's figures), the slowest rank's.
        ranks: a script's ranks, slowest first.
        extra: the lean probe; the built-in workload's wire figures; a script's loaders, the
            measured one, pin-memory, window.
    """

    workload: str
    mode: str
    runs: dict[str, Run]
    probe: StorageProbe | None
    num_workers: int
    batch_size: int
    num_samples: int
    machine: Machine
    split: bool
    cached_how: str
    notes: list[str] = field(default_factory=list)
    cached_hit_rate: float | None = None
    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    ranks: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cores(self) -> int:
        """Cores this process may run on."""
        return self.machine.cores
