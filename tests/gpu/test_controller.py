"""The hybrid split's controller: both sides keep pace, auto settles on the faster plan."""

from __future__ import annotations

import pytest

from unstall.gpu.controller import ShareController


def feed(controller, *, cpu_per_sample, gpu_per_sample, fixed_per_sample=0.0, batches=20):
    """Batches timed as if each side took its per-sample seconds; the last ``cpu_rows``."""
    n = controller.batch_size
    for _ in range(batches):
        k = controller.cpu_rows
        controller.observe(n, k, fixed_per_sample * n, cpu_per_sample * k, gpu_per_sample * (n - k))
    return controller.cpu_rows


def test_balanced_split_makes_both_sides_take_the_same_time():
    # 4 workers at 10 ms a sample (400 img/s together), GPU stage 2.5 ms (400 img/s): half each
    c = ShareController(64, 4, "hybrid")
    assert feed(c, cpu_per_sample=0.010, gpu_per_sample=0.0025) == 32
    # a GPU three times faster takes three quarters; fetching costs the workers time too
    c = ShareController(64, 4, "hybrid")
    k = feed(c, cpu_per_sample=0.010, gpu_per_sample=0.010 / 12)
    assert k == 16
    c = ShareController(64, 4, "hybrid")
    k = feed(c, cpu_per_sample=0.010, gpu_per_sample=0.0025, fixed_per_sample=0.001)
    assert k == round((4 * 64 * 0.0025 - 0.001 * 64) / (0.010 + 4 * 0.0025))
    assert (0.001 * 64 + k * 0.010) / 4 == pytest.approx((64 - k) * 0.0025, rel=0.05)


def test_hybrid_keeps_one_sample_on_each_side():
    assert feed(ShareController(16, 2, "hybrid"), cpu_per_sample=1.0, gpu_per_sample=1e-4) == 1
    assert feed(ShareController(16, 2, "hybrid"), cpu_per_sample=1e-4, gpu_per_sample=1.0) == 15


@pytest.mark.parametrize(
    ("cpu", "gpu", "mode", "rows"),
    [(1e-4, 1.0, "cpu", 16), (1.0, 1e-4, "gpu", 0), (0.004, 0.001, "hybrid", 8)],
)
def test_auto_settles_after_probing_and_says_why(cpu, gpu, mode, rows):
    c = ShareController(16, 4, "auto", probe_batches=5)
    assert c.cpu_rows == 8 and c.why == "measuring"
    feed(c, cpu_per_sample=cpu, gpu_per_sample=gpu, batches=5)
    assert c.mode == mode and c.cpu_rows == rows
    assert c.why.startswith("measured CPU workers ~")
    feed(c, cpu_per_sample=cpu, gpu_per_sample=gpu, batches=3)
    assert c.mode == mode  # settled: no more flapping
    summary = c.summary()
    assert summary["requested"] == "auto" and summary["mode"] == mode
    assert summary["cpu_samples"] + summary["gpu_samples"] == 16 * 8


def test_fixed_modes_never_move_and_bad_settings_are_named():
    assert feed(ShareController(8, 2, "cpu"), cpu_per_sample=1.0, gpu_per_sample=1e-4) == 8
    assert feed(ShareController(8, 2, "gpu"), cpu_per_sample=1e-4, gpu_per_sample=1.0) == 0
    with pytest.raises(ValueError, match="mode='fast'"):
        ShareController(8, 2, "fast")
    with pytest.raises(ValueError, match="batch_size=0"):
        ShareController(0, 2)


class FakeEvent:
    """A CUDA event stand-in: completes when told, at a given device time [ms]."""

    def __init__(self, at_ms, done=True):
        self.at_ms, self.done = at_ms, done

    def query(self):
        return self.done

    def elapsed_time(self, end):
        return end.at_ms - self.at_ms


class Recorder:
    """A controller stand-in that records what it was told."""

    mode = "hybrid"

    def __init__(self):
        self.seen = []

    def observe(self, n, k, fixed_s, cpu_s, gpu_s):
        self.seen.append((n, k, round(gpu_s, 6)))
        return k


def test_the_controller_gets_device_time_once_the_events_complete():
    """On CUDA the engine's kernels run after the host returns: the controller waits for each
    batch's end event and divides by the device's time (not the shorter host time); with
    batches in flight a batch counts from the previous one's end, not twice."""
    from types import SimpleNamespace

    from unstall.gpu.hybrid import HybridPrep, _Timed

    pipeline = SimpleNamespace(size=(8, 8), mean=(0.5,) * 3, std=(0.5,) * 3)
    controller, rows = Recorder(), SimpleNamespace(value=0)
    prep = HybridPrep(pipeline, SimpleNamespace(name="fake"), controller, rows)
    first_end = FakeEvent(30.0, done=False)
    prep._timed.append(_Timed(8, 2, (0.0, 0.0), 0.002, FakeEvent(0.0), first_end, None))
    prep._observe()
    assert controller.seen == []  # the device has not finished: nothing measured yet
    first_end.done = True
    second = _Timed(8, 4, (0.0, 0.0), 0.001, FakeEvent(10.0), FakeEvent(45.0), first_end)
    prep._timed.append(second)
    prep._timed.append(_Timed(8, 8, (0.0, 0.0), 0.0))  # all on the CPU: no engine time
    prep._observe()
    # 30 ms on the device (host 2 ms); then 45 - 30 = 15 ms since the first ended (its own
    # span, 35 ms, overlapped the first's); then none
    assert controller.seen == [(8, 2, 0.03), (8, 4, 0.015), (8, 8, 0.0)]
    assert prep.engine_s == pytest.approx(0.045) and prep.engine_batches == 2
    slow_host = _Timed(8, 0, (0.0, 0.0), 0.05, FakeEvent(50.0), FakeEvent(60.0), None)
    prep._timed.append(slow_host)
    prep._observe()
    assert controller.seen[-1] == (8, 0, 0.05)  # the host held the thread longer: that counts
