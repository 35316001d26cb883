"""What the measure stage hands on: the runs as measured, and the facts of the job.

Nothing here is derived: the rates stage (`unstall.analysis.rates`) reads it and never
asks the measure stage anything more.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from unstall.analysis.measure.machine import Machine
from unstall.analysis.measure.probe import StorageProbe


@dataclass
class Run:
    """One measured run [Unit: second]: the steps after warm-up only.

    ``spans``: the loader's per-batch spans inside the measured window
    (wait start, wait end, worker, start, fetch end, end, prepare CPU, samples).
    """

    kind: str
    samples: int
    wall_s: float
    wait_s: float
    compute_s: float
    steps: int
    start: float
    spans: list[tuple[float, ...]] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    step_s: list[float] = field(default_factory=list)
    compute_steps: list[float] = field(default_factory=list)
    #: CPU seconds of the training process (all its threads) over the measured steps
    proc_cpu_s: float = 0.0
    #: CPU seconds the whole machine was busy over the measured steps (other jobs included)
    machine_busy_s: float = 0.0
    #: CPU seconds of the loader's worker processes (all threads) over the measured steps
    workers_cpu_s: float = 0.0

    def other_cores(self) -> float:
        """Cores other processes kept busy during the run: the machine's busy time less this
        process's and its workers' (their CPU per batch, from the spans)."""
        if self.wall_s <= 0 or not self.spans:
            return 0.0
        workers = self.workers_cpu_s or sum(s[6] for s in self.spans)
        return max(0.0, (self.machine_busy_s - self.proc_cpu_s - workers) / self.wall_s)

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def compute_rate(self) -> float:
        """Samples/s of the model alone in this run: at its median time inside a step."""
        if not self.compute_steps or not self.samples:
            return 0.0
        median = sorted(self.compute_steps)[len(self.compute_steps) // 2]
        return self.samples / self.steps / median if median > 0 else 0.0

    @property
    def steady_rate(self) -> float:
        """Samples/s at the median step time: the rate without the machine's bursts."""
        if not self.step_s or not self.samples:
            return self.samples_per_s
        median = sorted(self.step_s)[len(self.step_s) // 2]
        return self.samples / self.steps / median if median > 0 else self.samples_per_s

    def summary(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "steps": self.steps,
            "wall_s": round(self.wall_s, 4),
            "wait_s": round(self.wait_s, 4),
            "compute_s": round(self.compute_s, 4),
            "samples_per_s": round(self.samples_per_s, 2),
        }


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
