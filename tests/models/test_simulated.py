"""The simulated accelerator: holds each batch as long as the model would, without host CPU."""

from __future__ import annotations

import time

import pytest
import torch

from unstall.models import MODEL_RATES, SimulatedAccelerator


def test_holds_each_batch_for_its_duration():
    accel = SimulatedAccelerator(rate=1000.0)
    start = time.perf_counter()
    for _ in range(5):
        accel.step(torch.zeros(10, 3))  # 10 samples at 1000/s: 10 ms each
    elapsed = time.perf_counter() - start
    assert accel.samples == 50
    assert 0.05 <= elapsed < 0.2
    assert accel.busy_s == pytest.approx(0.05)
    with pytest.raises(ValueError, match="rate=0"):
        SimulatedAccelerator(rate=0)
    assert MODEL_RATES["resnet50"] == 4000.0


def test_keeps_its_rate_on_average_and_takes_no_host_cpu():
    accel = SimulatedAccelerator(rate=8000.0)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(60):
        accel.step(list(range(40)))  # 5 ms a step
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert 0.3 <= wall < 0.3 * 1.5  # late wake-ups are taken off the next step
    assert cpu < 0.03  # sleeping; spinning the last ms of each step would cost >= 60 ms


def test_a_late_step_is_made_up_by_the_next():
    accel = SimulatedAccelerator(rate=1000.0)
    accel._late = 0.025  # the OS woke the last step 25 ms late
    start = time.perf_counter()
    accel.step(list(range(10)))  # 10 ms: already paid
    accel.step(list(range(10)))  # 10 ms: 5 ms paid
    assert time.perf_counter() - start < 0.009
    assert accel.busy_s == pytest.approx(0.02)
