"""How much torch's in-order delivery held a run's workers, read from its timeline.

torch hands batch k to worker ``k % workers`` and sends the task ``workers x prefetch_factor``
batches on only when the loop takes batch k. A worker that finished its tasks before then
waits, its core idle, for a batch another worker is late with. The timeline (one span a
batch, in the order the loop took them: the loop's wait, the worker, its start and end)
shows each such wait: a task that started when the batch ``workers x prefetch_factor``
earlier was taken, after its worker's previous task had ended. Beside a price that models
it (`unstall.analysis.model.predict.in_order_share`), it says whether the workers' idle time
was this wait, and how much their batch times varied.
"""

from __future__ import annotations

import statistics
from typing import Any


def in_order_figures(doc: dict[str, Any]) -> dict[str, float] | None:
    """``{"batch_cv", "in_order_wait_share"}`` of one run's document: the coefficient of
    variation of the workers' time per batch, and the share of the workers' time in the
    window spent waiting for a task the loop had not yet released; None without a timeline
    of at least a few batches from two workers or more.

    An epoch's last batch (fewer samples than the batch size) ends a stretch: the next
    epoch's workers are new and its tasks are sent afresh, so no wait is read across it.
    """
    spans = [s for s in doc.get("timeline") or [] if len(s) >= 8]
    workers = int(doc.get("num_workers") or 0)
    ahead = workers * int(doc.get("prefetch_factor") or 2)
    batch = int(doc.get("batch_size") or 0)
    if workers < 2 or len(spans) <= ahead:
        return None
    held = wall = 0.0
    first = 0  # the stretch's first batch (an epoch's, in the window)
    ended: dict[int, float] = {}  # each worker's previous task's end, in this stretch
    for k, s in enumerate(spans):
        worker, start = s[2], s[3]
        if k - first >= ahead and worker in ended:
            released = spans[k - ahead][1]  # the loop took that batch: this task was sent
            if released > ended[worker]:
                held += max(0.0, min(start, released) - ended[worker])
        ended[worker] = s[5]
        last = k + 1 == len(spans)
        if last or (batch and s[7] < batch):  # the epoch's last batch: a new stretch after
            stretch = spans[first : k + 1]
            wall += max(x[5] for x in stretch) - min(x[3] for x in stretch)
            first, ended = k + 1, {}
    took = [s[5] - s[3] for s in spans if not batch or s[7] == batch]
    mean = statistics.fmean(took) if took else 0.0
    return {
        "batch_cv": round(statistics.pstdev(took) / mean, 3) if mean > 0 else 0.0,
        "in_order_wait_share": round(held / (workers * wall), 4) if wall > 0 else 0.0,
    }
