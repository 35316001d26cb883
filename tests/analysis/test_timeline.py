"""Lanes and trace events from per-batch spans (exact times)."""

from __future__ import annotations

from unstall.analysis.report.timeline import LOOP, MAIN, MAIN_TID, chrome_trace, lanes

# (wait start, wait end, worker, start, fetch end, end, prepare CPU, samples)
SPANS = [
    (10.0, 10.3, 0, 10.0, 10.1, 10.3, 0.2, 8),
    (10.5, 10.6, 1, 10.1, 10.2, 10.6, 0.3, 8),
    (11.0, 11.0, 0, 10.3, 10.4, 10.8, 0.4, 8),
]


def test_lanes_from_spans():
    out = lanes(SPANS, seconds=5)
    rounded = {k: [(kind, round(a, 3), round(b, 3)) for kind, a, b in v] for k, v in out.items()}
    assert rounded[LOOP] == [
        ("wait", 0.0, 0.3),
        ("compute", 0.3, 0.5),
        ("wait", 0.5, 0.6),
        ("compute", 0.6, 1.0),
        ("wait", 1.0, 1.0),
    ]
    assert rounded["worker 0"] == [
        ("fetch", 0.0, 0.1),
        ("prepare", 0.1, 0.3),
        ("fetch", 0.3, 0.4),
        ("prepare", 0.4, 0.8),
    ]
    assert rounded["worker 1"] == [("fetch", 0.1, 0.2), ("prepare", 0.2, 0.6)]
    # a window of 0.55 s keeps only the batches asked for inside it
    assert len(lanes(SPANS, seconds=0.55)["worker 0"]) == 2


def test_trace_events_and_main_process_lane():
    main = [(1.0, 1.2, -1, 1.0, 1.0, 1.2, 0.1, 4)]  # a loader without workers: no fetch apart
    trace = chrome_trace(main)
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {(e["tid"], e["name"]) for e in events} == {(0, "wait"), (MAIN_TID, "prepare")}
    names = {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert names == {0: LOOP, MAIN_TID: MAIN}
    prepare = next(e for e in events if e["name"] == "prepare")
    assert (prepare["ts"], prepare["dur"]) == (0.0, 200000.0)
