"""The report as data (``--json``): the recommend stage's `Advice` laid out, nothing computed
again (the terminal and HTML outputs show this dict: `terminal`, `html`)."""

from __future__ import annotations

import json
import os
import platform
from typing import Any

from unstall.analysis.model.stage import Analysis
from unstall.analysis.rates.script import MODEL_SLOWED
from unstall.analysis.recommend.stage import Advice
from unstall.analysis.report import words

#: A script's figures for the report, in the order they are shown.
SCRIPT_KEYS = (
    "loaders",
    "measured_loader",
    "oversubscription",
    "pin_memory",
    "window",
    "ingestion_rate_alone",
    "file_cache",
)


def cores(n: float) -> str:
    """A count of cores, a share of them measured (``0.696204``), as a sentence says it:
    to one decimal, whole counts bare (``0.7``, ``2``, ``15.5``)."""
    return f"{round(n, 1):g}"


def sentence(a: Analysis) -> str:
    """The bottleneck in one plain sentence, from the measured rates."""
    d = a.derived
    s = shown_stall(a)
    g = d.rates.ingestion
    measured = d.measured
    if a.bottleneck == "compute":
        text = (
            f"Compute-bound: the model is busy {s['compute']:.0%} of the time "
            f"({measured:,.0f} of its {g:,.0f} samples/s"
        )
        alone = d.extra.get("ingestion_rate_alone") or 0.0
        if alone * MODEL_SLOWED > g:  # slowed beside the loader (the analysis took this rate)
            return text + (
                f"; {alone:,.0f}/s alone): the workers (or other jobs) take CPU from the "
                "model's own process, so fewer workers or less work per sample could speed "
                "this job up."
            )
        return text + "); faster data loading would not speed this job up."
    if a.bottleneck == "prep":
        p = a.prep_rate
        cap = f"{p:,.0f} samples/s" if p is not None else "a rate not measured"
        return (
            f"Prep-bound: the model waits {s['prep']:.0%} of the time for workers to decode and "
            f"augment ({cap} from {a.base_config.workers} workers on {cores(d.rates.cores)} cores; "
            f"{measured:,.0f}/s delivered, {g:,.0f}/s needed)."
        )
    f = f"{a.fetch_rate:,.0f} samples/s fetched" if "fetch" not in d.unknown else "fetch rate"
    return (
        f"Fetch-bound: the model waits {s['fetch']:.0%} of the time for storage "
        f"({f}; {measured:,.0f}/s delivered, {g:,.0f}/s needed)."
    )


def build_report(
    advice: Advice,
    *,
    html_dir: str | None = None,
    verified: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the outputs show, JSON-safe: a rate not measured is None, with its reason.

    ``html_dir``: where the HTML report goes (its page and trace are named); ``verified``:
    the re-run under the recommendation (script mode).
    """
    a = advice.analysis
    d, m = a.derived, a.measurement
    prep, per_worker = a.prep_rate, d.prep_rate_per_worker
    notes = [*d.notes, *_stall_note(a)]
    out: dict[str, Any] = {
        "workload": m.workload,
        "ingestion_rate": round(d.rates.ingestion, 2),
        "prep_rate": round(prep, 2) if prep is not None else None,
        "prep_rate_per_worker": round(per_worker, 2) if per_worker is not None else None,
        "fetch_rate": round(d.fetch_rate, 2)
        if "fetch" not in d.unknown and d.fetch_rate is not None
        else None,
        "fetch_rate_measured": round(m.runs["fetch"].samples_per_s, 2)
        if "fetch" in m.runs
        else None,
        "not_measured": dict(d.unknown),
        "stall": d.stall,
        "stall_shown": shown_stall(a),
        "bottleneck": a.bottleneck,
        "summary": sentence(a),
        "measured_samples_per_s": round(d.measured, 2),
        "num_workers": m.num_workers,
        "batch_size": m.batch_size,
        "num_samples": m.num_samples,
        "cores": d.rates.cores,
        "runs": {k: r.summary() for k, r in m.runs.items()},
        "rates": d.rates.as_dict(),
        "storage": m.probe.as_dict() if m.probe is not None else None,
        "cached_run": {"how": m.cached_how, "hit_rate": m.cached_hit_rate},
        "split": (
            "fetch and prepare timed apart (the dataset has fetch/prepare)"
            if m.split
            else "per sample, worker CPU time = prepare, waiting for a core = oversubscription, "
            "the rest = fetch (waiting on I/O)"
        ),
        "model_check": a.model_check,
        "what_if": a.what_if,
        "curves": a.curves,
        "recommendation": recommendation(advice),
        "remedies": [
            words.row(o, advice.recommendation.get("remedy", "")) for o in advice.remedies
        ],
        "notes": notes,
        "machine": {"cores": d.rates.cores, "python": platform.python_version()},
    }
    extra = {**m.extra, **d.extra}
    out.update((k, extra[k]) for k in SCRIPT_KEYS if k in extra)
    if advice.loaders:  # each other loader's pass priced, and what the config holds for it
        out["loaders"] = advice.loaders
    if a.question is not None:
        out["question"] = a.question
    if html_dir is not None:
        out["html"] = os.path.join(html_dir, "index.html")
        out["trace"] = os.path.join(html_dir, "trace.json")
    if verified is not None:
        out["verified"] = verified
    if m.mode == "script":
        out["ranks"] = m.ranks
        out["slowest_rank"] = m.ranks[0]["rank"]
    return out


def recommendation(advice: Advice) -> dict[str, Any]:
    """The recommendation as the report shows it: the chosen option's words (what it is, how
    it is applied) where it is a remedy, and the one sentence on the options priced above it
    that it is not (``why_not_others``)."""
    rec = dict(advice.recommendation)
    chosen = next((o for o in advice.remedies if o.remedy == rec.get("remedy")), None)
    if chosen is not None:
        rec.update(what=words.what(chosen), applies=words.applies(chosen))
        if chosen.config is not None and "saved_s_per_epoch" in (rec.get("other_loaders") or {}):
            # the config serves the other loaders too: what the file holds is the whole of it
            mine = json.dumps(dict(chosen.config))
            rec["applies"] = rec["applies"].replace(mine, json.dumps({"kwargs": rec["kwargs"]}))
    sentence = words.not_chosen(rec)
    if sentence:
        rec["why_not_others"] = sentence
    return rec


def fetch_limits(a: Analysis) -> bool:
    """Whether fetch can limit this job's rate: it is fetch-bound, its fetch rate F was not
    measured (but for want of any I/O wait to time: then it cannot), or F is below the rate
    its model takes (G)."""
    d = a.derived
    f = d.fetch_rate
    if a.bottleneck == "fetch":
        return True
    if d.io_unseen:
        return False
    if "fetch" in d.unknown or f is None:
        return True
    return f < d.rates.ingestion


def shown_stall(a: Analysis) -> dict[str, float]:
    """The cold run's stall shares as the report shows them: the fetch stall where fetch can
    limit the rate (`fetch_limits`); else the workers' wait on I/O is counted with their
    preparing (storage delivers more than the model takes: no fetch stall to remove)."""
    s = dict(a.derived.stall)
    if fetch_limits(a):
        return s
    return {"compute": s["compute"], "prep": s["prep"] + s["fetch"], "fetch": 0.0}


def _stall_note(a: Analysis) -> list[str]:
    d = a.derived
    if fetch_limits(a) or d.stall["fetch"] <= 0:
        return []
    why = (
        "too little to time storage by"
        if d.fetch_rate is None
        else f"storage delivers {d.fetch_rate:,.0f} samples/s, above the model's "
        f"{d.rates.ingestion:,.0f}/s"
    )
    return [
        f"the workers waited on I/O {d.stall['fetch']:.0%} of the cold run, shown as prep stall: "
        f"{why}, so fetch does not limit this job"
    ]
