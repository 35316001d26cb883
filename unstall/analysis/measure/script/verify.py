"""The recommendation verified: the script run once more under it, the way ``unstall run
--config`` applies it, and a verdict against the job as it was (or as it is, re-run).

A measurement taken after the recommend stage, of plain inputs (the recommendation's
settings and prediction, the measured rate); the report stage shows what it returns.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

from unstall.analysis.measure.script.runner import run_of, run_once


def verify_recommendation(
    command: Sequence[str],
    recommendation: dict[str, Any],
    before: float,
    window: dict[str, Any],
) -> dict[str, Any]:
    """Run the script once more under the recommendation (``unstall run --config``'s way);
    ``before``: the samples/s the job measured as it is.

    A re-run slower than the job was (beyond ``SPREAD``) is followed by one of the job as it
    is, back to back: the verdict then compares the two, so a machine that slowed down
    between the runs is not taken for a wrong recommendation, nor the reverse.
    """
    rec = recommendation
    _last.clear()
    measured = _rate_under(command, window, rec["kwargs"])
    workers = _last.pop("workers", None)
    others = _last.pop("loaders", None)  # the other loaders' passes, to pair with their price
    cache = {k: v for k, v in _last.items() if k != "autotune"}  # the file cache's, if any
    tuned = _last.get("autotune")  # what num_workers="auto" settled on, if asked
    control = None
    if rec["changed"] and measured < (1 - SPREAD) * before:
        control = _rate_under(command, window, None)
    predicted = rec["predicted_samples_per_s"]
    return {
        "kwargs": rec["kwargs"],
        "changed": rec["changed"],
        "predicted_samples_per_s": predicted,
        "measured_samples_per_s": measured,
        "before_samples_per_s": before,
        **({"control_samples_per_s": control} if control is not None else {}),
        "error": round(abs(predicted - measured) / measured, 4) if measured else None,
        "verdict": _verdict(rec["changed"], measured, before, control),
        **({"cache": cache} if cache else {}),
        **({"autotune": tuned} if tuned else {}),
        **({"workers": workers} if workers else {}),
        **({"loaders": others} if others else {}),
    }


#: Run-to-run spread of one configuration that the verdict takes for noise.
SPREAD = 0.08


#: The last run's file-cache figures (`_rate_under`), for the verification's report.
_last: dict[str, Any] = {}


def _rate_under(command: Sequence[str], window: dict[str, Any], kwargs: Any) -> float:
    """Samples/s of one cold run, under ``kwargs`` (``None``: the job's own settings).

    A dataset that opens its files itself finds the node cache filled before timing, as
    the first epoch leaves it (`unstall.analysis.measure.script.files.prefill`): the window
    is the steady state the recommendation was priced for."""
    path = None
    if kwargs is not None:
        fd, path = tempfile.mkstemp(prefix="unstall-rec-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"kwargs": kwargs}, f)
    try:
        docs = run_once(command, "cold", window, config_path=path)
    finally:
        if path is not None:
            os.unlink(path)
    doc = docs[0]
    tuned = (doc.get("stats") or {}).get("autotune")
    if tuned:  # num_workers="auto": what the tuner settled on in this run, and its walk
        _last["autotune"] = {
            "settled_on": tuned.get("num_workers"),
            "changes": tuned.get("changes"),
            "path": _path(tuned),
        }
    figures = (doc.get("stats") or {}).get("cache") or {}
    if doc.get("prefilled") or figures.get("level") == "file":
        _last.update(prefilled=doc.get("prefilled"), stats=figures)
    if kwargs is not None:
        _last["workers"] = worker_figures(doc)
        _last["loaders"] = [r for r in doc.get("loaders") or [] if r.get("later_pass")]
    return round(run_of("cold", doc).samples_per_s, 1)


def worker_figures(doc: dict[str, Any]) -> dict[str, Any]:
    """What the run's workers spent per sample (ms: CPU, waiting for a core), the training
    process's CPU per sample (all of it, and its receive of the batches), the cores other
    processes kept busy meanwhile, and the spread of the workers' batch times with the share
    of their time torch's in-order delivery held them (`in_order_figures`): beside a price,
    they say whether a gap is the cost per sample, the delivery or the machine's load."""
    from unstall.analysis.rates.in_order import in_order_figures
    from unstall.analysis.rates.script import figures

    f = figures(doc)
    out: dict[str, Any] = {"other_cores": round(f.other_cores, 2)}
    if f.worker_cpu_s is not None:
        out["cpu_ms_per_sample"] = round(f.worker_cpu_s * 1e3, 3)
        out["core_wait_ms_per_sample"] = round((f.worker_runq_s or 0.0) * 1e3, 3)
    out["main_cpu_ms_per_sample"] = round(f.proc_cpu_s * 1e3, 3)
    out["receive_ms_per_sample"] = round(f.receive_cpu_s * 1e3, 3)  # included in main's
    out.update(in_order_figures(doc) or {})  # the batches' spread, the in-order wait
    out.update(whole_epochs(doc) or {})
    return out


def whole_epochs(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The run's whole epochs from the second, each from its ``iter()`` to its last batch
    (`unstall.loader.stats`): ``{"epochs", "epoch_samples_per_s"}``, None for fewer than two
    epochs. The price and the verified rate are the steady state inside an epoch; where
    workers are not persistent each epoch also starts them again (a fork of the script's
    process and their first batch), which a short epoch feels: on the audio example's
    1,000 clips under the sample cache, 2,730-2,780/s whole against 3,390-3,450/s verified
    inside the epochs (three runs, docs/analyze-audio-run*.json)."""
    later = (doc.get("epochs") or [])[1:]
    full = [e for e in later if e[0] == later[0][0]]  # a cut-short last one aside
    samples, wall = sum(e[0] for e in full), sum(e[1] for e in full)
    if not full or wall <= 0:
        return None
    return {"epochs": len(full), "epoch_samples_per_s": round(samples / wall, 1)}


def _path(tuned: dict[str, Any]) -> list[int]:
    """The worker counts the tuner ran, in order (its start, then each change's)."""
    history = tuned.get("history") or []
    if not history:
        return [tuned.get("num_workers")]
    return [history[0]["num_workers"][0], *(h["num_workers"][1] for h in history)]


def _verdict(changed: bool, measured: float, before: float, control: float | None) -> str:
    """One line on what the re-run shows, against the run it is fairly compared with."""
    if not changed:
        diff = (measured - before) / before if before else 0.0
        return (
            "the recommendation keeps the job's settings: this re-run of them shows the "
            f"machine's run-to-run spread ({diff:+.0%})"
        )
    ref, against = before, "the job as it was"
    if control:
        ref, against = control, "the job as it is, re-run just after"
    diff = (measured - ref) / ref if ref else 0.0
    if diff >= SPREAD:
        return f"{diff:.0%} faster than {against}"
    if diff >= -SPREAD:
        return f"within the run-to-run spread of {against} ({diff:+.0%})"
    return f"{-diff:.0%} slower than {against}: the recommendation did not hold here"
