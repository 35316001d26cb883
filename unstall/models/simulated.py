"""A simulated accelerator: holds each batch for batch_size / rate seconds.

There is no GPU here; a consumer that is busy for as long as a real model
would take per batch makes data stalls show as they would in training.
Reference rates on one H100 (../shared/DESIGN.md section 8): ResNet-50 ~4,000
samples/s, ResNet-18 ~12,000.
"""

from __future__ import annotations

import time
from typing import Any

from unstall.models.batch import batch_size_of

#: Measured training rates on one H100 (samples/s), for `--model` style choices.
MODEL_RATES = {"resnet18": 12000.0, "resnet50": 4000.0, "mobilenet_v2": 6150.0, "vit_b_16": 2110.0}


class SimulatedAccelerator:
    """Consumes batches at ``rate`` samples/s; ``rate=None`` consumes instantly.

    Args:
        rate: samples per second the simulated model ingests.
    """

    def __init__(self, rate: float | None):
        if rate is not None and rate <= 0:
            raise ValueError(f"rate={rate} must be > 0 samples/s, or None for no compute")
        self.rate = rate
        self.busy_s = 0.0
        self.samples = 0
        self._late = 0.0  # how late the OS woke the last step: taken off the next one

    def step(self, batch: Any) -> None:
        """Hold ``batch`` as long as the model would take to train on it.

        It sleeps rather than spins: a GPU's compute takes no host CPU, and on a
        machine whose cores prepare the data, a spinning model would take their time
        (1 ms per step and job: a tenth of the CPU of a 4-job sweep here). The OS wakes
        a sleeper a little late; that lateness is taken off the next step, so the
        rate holds on average.
        """
        n = batch_size_of(batch)
        self.samples += n
        if self.rate is None:
            return
        duration = n / self.rate
        self.busy_s += duration
        remaining = duration - self._late
        if remaining <= 0:
            self._late = -remaining
            return
        start = time.perf_counter()
        time.sleep(remaining)
        self._late = min(max(time.perf_counter() - start - remaining, 0.0), duration)
