"""A few seconds of a run as lanes (one per worker, one for the training loop), and the
same as a Chrome trace-event JSON (what torch.profiler exports; Perfetto and
``chrome://tracing`` open it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

#: Lane names of the training loop, and of loading done in it (a loader without workers).
LOOP = "training loop"
MAIN = "main process"
MAIN_TID = 1000


def lanes(spans: Sequence[tuple[float, ...]], seconds: float = 3.0) -> dict[str, list[tuple]]:
    """``{lane: [(kind, start_s, end_s), ...]}``, times from the first span, ``seconds`` long.

    Workers get ``fetch`` and ``prepare`` segments; the loop gets ``wait`` (for data) and
    ``compute`` (from a batch handed out to the next request).
    """
    if not spans:
        return {}
    ordered = sorted(spans, key=lambda s: s[0])
    origin = ordered[0][0]
    end = origin + seconds
    out: dict[str, list[tuple]] = {LOOP: []}
    prev_end = None
    for wait0, wait1, worker, t0, t1, t2, *_rest in ordered:
        if wait0 > end:
            break
        if prev_end is not None and wait0 > prev_end:
            out[LOOP].append(("compute", prev_end - origin, wait0 - origin))
        out[LOOP].append(("wait", wait0 - origin, wait1 - origin))
        prev_end = wait1
        lane = out.setdefault(lane_name(int(worker)), [])
        if t1 > t0:
            lane.append(("fetch", max(t0, origin) - origin, t1 - origin))
        lane.append(("prepare", max(t1, origin) - origin, t2 - origin))
    return out


def lane_name(worker: int) -> str:
    """``worker K``, or ``main process`` when the loader loads without workers."""
    return f"worker {worker}" if worker >= 0 else MAIN


def lane_order(name: str) -> int:
    """Lanes top to bottom: the training loop, loading in the main process, workers by id."""
    return -2 if name == LOOP else -1 if name == MAIN else int(name.split()[-1])


def chrome_trace(spans: Sequence[tuple[float, ...]], *, seconds: float = 10.0) -> dict[str, Any]:
    """The spans as trace events: pid 1, thread 0 = the training loop, thread k+1 = worker k
    (1000: loading in the main process)."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "unstall analyze"}},
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": LOOP}},
    ]
    named: set[int] = set()
    for lane, segments in lanes(spans, seconds).items():
        if lane == LOOP:
            tid = 0
        else:
            tid = MAIN_TID if lane == MAIN else lane_order(lane) + 1
            if tid not in named:
                named.add(tid)
                events.append(
                    {"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": lane}}
                )
        for kind, start, end in segments:
            events.append(
                {
                    "name": kind,
                    "cat": "loop" if tid == 0 else "loader",
                    "ph": "X",
                    "pid": 1,
                    "tid": tid,
                    "ts": round(start * 1e6, 3),
                    "dur": round(max(end - start, 0.0) * 1e6, 3),
                }
            )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_trace(path: str, spans: Sequence[tuple[float, ...]]) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(spans), f)
