"""Every loader of the script as the cold run saw it: one row each for the loaders table, and
for each loader besides the measured one, its passes and its dataset's cacheability.

A script trains on one loader and, most often, evaluates on another each epoch: the
validation pass is time the training job waits too. The measured loader (the one that
carries the training loop) is priced from its steady window; every other loader that
handed out batches gets here:

- its passes (one per iterator): batches, samples, the loop's wait for them, and the
  pass's wall time, from the loop's first request to its last batch plus the loop's mean
  time on a batch (the time after the last batch is not seen: the script moves on);
- its dataset's cacheability: the same check the measured loader's dataset gets
  (`unstall.analysis.measure.script.samples.sample_cache_facts`: a file per sample, the
  determinism check on its own samples, the bytes and the hit's cost per sample), bounded
  in count (`MAX_OTHERS` loaders) and time (`CHECK_MAX_S` for all of them); a dataset
  shared with the measured loader reuses its facts.

The recommend stage prices them (`unstall.analysis.recommend.loaders`).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from unstall.analysis.measure.script.samples import loader_sample_cache_facts
from unstall.analysis.measure.steady import Handout

#: Other loaders whose datasets are checked, at most (the first made, in order).
MAX_OTHERS = 4
#: Seconds the other loaders' checks may take together; a loader past it is said unchecked.
CHECK_MAX_S = 60.0
#: Passes listed per loader, at most (the first ones).
PASSES_SHOWN = 8


def passes(handed: list[Handout]) -> list[dict[str, Any]]:
    """Each iterator's pass over the loader: batches, samples, the loop's wait (all of it,
    and for the first batch, which holds the workers' start), and its wall time (module
    notes)."""
    by_seg: dict[int, list[Handout]] = {}
    for h in handed:
        by_seg.setdefault(h.seg, []).append(h)
    out = []
    for _, hs in sorted(by_seg.items()):
        wait = sum(h.wait for h in hs)
        span = hs[-1].t - (hs[0].t - hs[0].wait)
        # the loop's mean time on a batch: the pass's last batch is worked on that long too
        step = (hs[-1].t - hs[0].t - (wait - hs[0].wait)) / (len(hs) - 1) if len(hs) > 1 else 0.0
        out.append(
            {
                "batches": len(hs),
                "samples": sum(h.n for h in hs),
                "wait_s": round(wait, 6),
                "first_wait_s": round(hs[0].wait, 6),
                "wall_s": round(span + max(0.0, step), 6),
            }
        )
    return out


def typical_pass(rows: list[dict[str, Any]], length: int | None) -> dict[str, Any] | None:
    """The pass the loader's price is taken from: the median (by wall time) of its whole
    passes (``length`` batches), else of all it made; None when it made none."""
    whole = [p for p in rows if length is not None and p["batches"] == length] or rows
    if not whole:
        return None
    ordered = sorted(whole, key=lambda p: p["wall_s"])
    mid = ordered[(len(ordered) - 1) // 2]
    return {**mid, "whole": length is not None and mid["batches"] == length}


def loader_rows(
    watches: Iterable[Any],
    measured: Any,
    *,
    check: bool,
    measured_facts: dict[str, Any] | None,
) -> list[dict[str, Any]]:
    """One row per loader (``watches``: the agent's); ``measured``: the watch measured.
    ``check``: the other loaders' datasets are checked (the cold run of the job as it is)."""
    deadline = time.monotonic() + CHECK_MAX_S
    measured_ds = getattr(measured.loader, "dataset", None)
    facts_of: dict[int, dict[str, Any] | None] = {id(measured_ds): measured_facts}
    rows, others = [], 0
    for w in watches:
        row = summary(w, w is measured)
        if w is measured or not w.handed:
            rows.append(row)
            continue
        row["length"] = _length(w.loader)
        row["num_workers"] = int(getattr(w.loader, "num_workers", 0) or 0)
        row["batch_size"] = getattr(w.loader, "batch_size", None)
        found = passes(w.handed)
        row["passes"] = found[:PASSES_SHOWN]
        row["pass"] = typical_pass(found, row["length"])
        row["later_pass"] = later_pass(found, row["length"])
        if check:
            others += 1
            row["sample_cache"] = _facts(w.loader, facts_of, others, deadline)
        else:  # under a config (the verification): what its cache held and served
            row["cache"] = cache_figures(w.loader)
        rows.append(row)
    return rows


def _facts(
    loader: Any, facts_of: dict[int, dict[str, Any] | None], k: int, deadline: float
) -> dict[str, Any] | None:
    """The sample cache's facts for ``loader``'s dataset (the ``k``-th other loader), or why
    it was not checked."""
    dataset = getattr(loader, "dataset", None)
    if id(dataset) in facts_of and facts_of[id(dataset)] is not None:
        return facts_of[id(dataset)]
    if k > MAX_OTHERS:
        why = f"only the first {MAX_OTHERS} other loaders are checked"
        return {"applies": False, "check": "not checked", "why": why}
    if time.monotonic() > deadline:
        why = f"the other loaders' checks took their {CHECK_MAX_S:g} s"
        return {"applies": False, "check": "not checked", "why": why}
    try:
        facts = loader_sample_cache_facts(loader)
    except Exception as exc:  # another loader's odd dataset must not end the measurement
        facts = {"applies": False, "check": "error", "why": f"{type(exc).__name__}: {exc}"}
    facts_of[id(dataset)] = facts
    return facts


def summary(watch: Any, measured: bool) -> dict[str, Any]:
    """One row of the loaders table: what this loader handed out and how long the loop waited."""
    handed = watch.handed
    wait = sum(h.wait for h in handed)
    span = (handed[-1].t - (handed[0].t - handed[0].wait)) if handed else 0.0
    return {
        "index": watch.index,
        "dataset": type(getattr(watch.loader, "dataset", None)).__name__,
        "class": type(watch.loader).__name__,
        "batches": len(handed),
        "samples": sum(h.n for h in handed),
        "iterators": len(watch.segs),
        "wait_s": round(wait, 6),
        "wait_share": round(min(1.0, wait / span), 4) if span > 0 else None,
        "measured": measured,
    }


def cache_figures(loader: Any) -> dict[str, Any] | None:
    """What ``loader``'s cache holds and served so far (its level, hits, misses, entries),
    None without one."""
    stats = getattr(loader, "stats", None)
    try:
        cache = (stats() if stats is not None else {}).get("cache") or {}
    except Exception:  # a loader's figures must not end the measurement
        return None
    keys = ("level", "hits", "misses", "items_cached", "failed_check")
    return {k: cache[k] for k in keys if cache.get(k) is not None} or None


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:  # an iterable dataset without a length
        return None


def later_pass(rows: list[dict[str, Any]], length: int | None) -> dict[str, Any] | None:
    """The typical pass after the first (which fills a cache), with how many it is of; the
    first where it is the only one; None for none."""
    later = rows[1:] or rows
    typical = typical_pass(later, length)
    if typical is None:
        return None
    return {**typical, "of": len(later), "first": len(rows) == 1}
