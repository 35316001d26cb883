"""The in-order wait read from a run's timeline: a worker that finished its tasks waits for
the loop to take the batch ``workers x prefetch_factor`` before its next one; an epoch's
last (short) batch ends a stretch, and nothing is read across it."""

from __future__ import annotations

import pytest

from unstall.analysis.measure.script.verify import worker_figures
from unstall.analysis.rates.in_order import in_order_figures
from unstall.analysis.report.terminal import verified_workers_text


def span(taken: float, worker: int, start: float, end: float, samples: int = 4) -> list[float]:
    """One timeline entry: the loop's wait (ending when it took the batch), the worker's span."""
    return [taken - 0.01, taken, worker, start, start, end, end - start, samples, 0.0]


#: 2 workers x prefetch 1, batches of 4. Worker 1's first batch is slow (3 s): worker 0,
#: done with its second at 2.0, is sent its third only when the loop takes its second (3.1).
#: The epoch ends with a batch of 2; the next one's workers start afresh at 10.
TIMELINE = [
    span(1.0, 0, 0.0, 1.0),
    span(3.0, 1, 0.0, 3.0),
    span(3.1, 0, 1.0, 2.0),
    span(4.0, 1, 3.0, 4.0),
    span(4.1, 0, 3.1, 4.1),
    span(5.0, 1, 4.0, 5.0, samples=2),
    span(11.0, 0, 10.0, 11.0),
    span(11.1, 1, 10.0, 11.0),
    span(12.0, 0, 11.0, 12.0),
]


def test_the_wait_for_a_released_task_is_read_per_epoch():
    doc = {"timeline": TIMELINE, "num_workers": 2, "prefetch_factor": 1, "batch_size": 4}
    out = in_order_figures(doc)
    # held 3.1 - 2.0 s; the workers' time: 2 x (5 s + 2 s) of the two stretches
    assert out["in_order_wait_share"] == pytest.approx(1.1 / 14, abs=1e-4)
    # the full batches' times: seven of 1 s, one of 3 s
    assert out["batch_cv"] == pytest.approx(0.529, abs=1e-3)
    # one worker, or too few batches: nothing to read
    assert in_order_figures({**doc, "num_workers": 1}) is None
    assert in_order_figures({**doc, "timeline": TIMELINE[:2]}) is None
    # prefetch 2: each task was sent before its worker was free, nothing held
    assert in_order_figures({**doc, "prefetch_factor": 2})["in_order_wait_share"] == 0.0


def test_the_verifications_worker_figures_carry_them():
    doc = {"timeline": TIMELINE, "num_workers": 2, "prefetch_factor": 1, "batch_size": 4}
    doc.update(steps=[[0.01, 0.1, 4]] * 9, main_cpu_s=0.01)
    figures = worker_figures(doc)
    assert figures["in_order_wait_share"] == pytest.approx(0.0786, abs=1e-4)
    assert figures["batch_cv"] == pytest.approx(0.529, abs=1e-3)
    text = verified_workers_text({"workers": figures})
    assert "batch times varying 53%, the workers waiting 7.9% of their time on the in-order" in text
