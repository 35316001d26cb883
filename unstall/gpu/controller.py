"""How many samples of each batch the CPU workers prepare in hybrid prep, from measured rates.

Per batch of ``n`` the CPU side (``W`` workers in parallel) spends ``f + k * c``
seconds per worker (``f``: fetching and drawing boxes for the whole batch, ``c``:
one lean sample), the GPU stage ``(n - k) * g`` seconds (``g``: one sample there).
Both sides keep pace when ``(f + k c) / W == (n - k) g``, i.e.
``k = (W n g - f) / (c + W g)``. ``f``, ``c``, ``g`` are moving averages of what the
last batches measured, so the split follows the run (a model that speeds up, a
page cache that warms, the GPU busier with training).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("unstall")

#: Modes a controller runs in: ``auto`` measures, then settles on one of the other three.
MODES = ("auto", "cpu", "gpu", "hybrid")


@dataclass
class _Average:
    """An exponential moving average that is None until its first value."""

    weight: float
    value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.weight * (x - self.value)


class ShareController:
    """The number of CPU-prepared samples per batch (``cpu_rows``), updated after each batch.

    Args:
        batch_size: samples per batch.
        workers: CPU worker processes (0: the loader's main process prepares, counted as 1).
        mode: ``"cpu"``/``"gpu"``: every sample on that side; ``"hybrid"``: follow the
            rates, keeping at least one sample on each side so both stay measured;
            ``"auto"``: like hybrid for ``probe_batches``, then settle on ``cpu``, ``gpu``
            or ``hybrid`` by the rates measured, and say why.
        probe_batches: batches ``auto`` measures before it decides.
        weight: weight of the newest batch in the moving averages.
    """

    def __init__(
        self,
        batch_size: int,
        workers: int,
        mode: str = "hybrid",
        *,
        probe_batches: int = 8,
        weight: float = 0.25,
    ):
        if mode not in MODES:
            raise ValueError(f"mode={mode!r} must be one of {MODES}")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be >= 1")
        if probe_batches < 1:
            raise ValueError(f"probe_batches={probe_batches!r} must be >= 1")
        self.batch_size = batch_size
        self.workers = max(1, workers)
        self.requested = mode
        self.mode = mode
        self.probe_batches = probe_batches
        self.why = {
            "cpu": "prep='cpu' asked",
            "gpu": "prep='gpu' asked",
            "hybrid": "prep='hybrid' asked: the CPU share follows both sides' measured rates",
        }.get(mode, "measuring")
        self._fixed, self._cpu, self._gpu = _Average(weight), _Average(weight), _Average(weight)
        self._lock = threading.Lock()
        self.batches = 0
        self.cpu_samples = 0
        self.gpu_samples = 0
        self.cpu_rows = {"cpu": batch_size, "gpu": 0}.get(mode, batch_size // 2)

    def observe(self, n: int, k: int, fixed_s: float, cpu_s: float, gpu_s: float) -> int:
        """Record one batch (``k`` of ``n`` samples on the CPU); return the new ``cpu_rows``.

        Args:
            n: samples in the batch.
            k: of which the CPU workers prepared.
            fixed_s: worker seconds for the batch besides preparing samples [Unit: second].
            cpu_s: worker seconds preparing the ``k`` samples [Unit: second].
            gpu_s: GPU stage seconds for the other ``n - k`` [Unit: second].
        """
        with self._lock:
            self.batches += 1
            self.cpu_samples += k
            self.gpu_samples += n - k
            if self.batches == 1:  # the first batch pays for start-up (DALI's build): not a rate
                return self.cpu_rows
            self._fixed.add(max(0.0, fixed_s) / max(1, n))  # per sample: batches vary in size
            if k > 0:
                self._cpu.add(max(0.0, cpu_s) / k)
            if n - k > 0:
                self._gpu.add(max(0.0, gpu_s) / (n - k))
            if self.mode in ("hybrid", "auto"):
                self.cpu_rows = self._balanced()
            if self.mode == "auto" and self.batches >= self.probe_batches:
                self._settle()
            return self.cpu_rows

    def give_up_gpu(self, why: str) -> int:
        """Every later sample on the CPU workers (the GPU stage has no engine left); why, logged
        by the engine chain. Returns the new ``cpu_rows``."""
        with self._lock:
            self.mode, self.cpu_rows = "cpu", self.batch_size
            self.why = why
            return self.cpu_rows

    def _ideal(self) -> float | None:
        """Unclamped balanced ``k`` for a full batch, None until both sides are measured."""
        c, g, f = self._cpu.value, self._gpu.value, self._fixed.value or 0.0
        if c is None or g is None:
            return None
        n, w = self.batch_size, self.workers
        return (w * n * g - f * n) / max(c + w * g, 1e-12)

    def _balanced(self) -> int:
        ideal = self._ideal()
        n = self.batch_size
        if ideal is None:
            return n // 2
        low, high = (1, n - 1) if n >= 2 else (0, n)
        return int(min(max(round(ideal), low), high))

    def _settle(self) -> None:
        ideal = self._ideal()
        if ideal is None:
            return
        n = self.batch_size
        rates = self.rates()
        said = f"CPU workers ~{rates['cpu_per_s']:,.0f} img/s, GPU stage ~{rates['gpu_per_s']:,.0f}"
        if ideal >= n - 0.5:
            self.mode, self.cpu_rows = "cpu", n
            self.why = f"measured {said}: the CPU workers alone keep pace"
        elif ideal <= 0.5:
            self.mode, self.cpu_rows = "gpu", 0
            self.why = f"measured {said}: the GPU stage alone keeps pace"
        else:
            self.mode = "hybrid"
            self.why = f"measured {said}: both, about {ideal / n:.0%} of each batch on the CPU"
        log.info("prep='auto' chose %s after %d batches: %s", self.mode, self.batches, self.why)

    def rates(self) -> dict[str, float]:
        """Each side's measured rate alone [Unit: sample/s]; 0 where not measured yet."""
        c, g = self._cpu.value, self._gpu.value
        f = self._fixed.value or 0.0
        return {
            "cpu_per_s": self.workers / (c + f) if c else 0.0,
            "gpu_per_s": 1.0 / g if g else 0.0,
        }

    def summary(self) -> dict[str, Any]:
        """Which side prepared what and why: the ``prep`` section of ``loader.stats()``."""
        total = self.cpu_samples + self.gpu_samples
        rates = self.rates()
        return {
            "requested": self.requested,
            "mode": self.mode,
            "why": self.why,
            "cpu_rows_per_batch": self.cpu_rows,
            "cpu_samples": self.cpu_samples,
            "gpu_samples": self.gpu_samples,
            "cpu_share": round(self.cpu_samples / total, 4) if total else 0.0,
            "cpu_rate_per_s": round(rates["cpu_per_s"], 1),
            "gpu_rate_per_s": round(rates["gpu_per_s"], 1),
        }
