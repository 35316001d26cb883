"""`unstall analyze` end to end, one way: measure -> rates -> model -> recommend -> report.

Each stage reads the result of the one before and returns its own (`Measurement`,
`Derived`, `Analysis`, `Advice`, the report dict); no stage calls back into an
earlier one. This module only runs them in order, for both modes: a workload in
this process (`analyze`, `analyze_workload`, `report_of`) and an unchanged script
(`analyze_script`, which verifies the recommendation by a measurement of its own).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from unstall import machine
from unstall.analysis.measure.script.runner import RUN_TIMEOUT_S, measure_script, window_of
from unstall.analysis.model.predict import Config
from unstall.analysis.model.stage import Analysis, ask, model_of
from unstall.analysis.model.whatif import parse_what_if
from unstall.analysis.rates.result import LEAST_CORES
from unstall.analysis.rates.script import derive_script
from unstall.analysis.rates.workload import derive_workload
from unstall.analysis.recommend.stage import advise
from unstall.analysis.report.build import build_report

if TYPE_CHECKING:
    from unstall.analysis.measure.workload import Workload

#: (warm-up, measured) steps: default and ``quick``.
STEPS = (10, 200)
QUICK_STEPS = (3, 30)


def analyze(
    data: str | os.PathLike[str] | None = None,
    *,
    model: str = "resnet50",
    rate: float | None = None,
    dataset: Any = None,
    step: Callable[[Any], None] | None = None,
    batch_size: int = 64,
    num_workers: int | None = None,
    warmup: int | None = None,
    steps: int | None = None,
    quick: bool = False,
    what_if: str | None = None,
    html_dir: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Measure a job and return the report as data (what ``unstall analyze --json`` writes).

    Either ``data`` (a folder or ``s3://`` URL of images: the built-in workload with
    ``model`` at ``rate`` samples/s), or your own ``dataset`` and ``step`` (trains on
    one batch). ``html_dir`` also writes the HTML report, its plots and ``trace.json``.
    """
    if (data is None) == (dataset is None):
        raise ValueError("pass either data=DIR_OR_URL (built-in workload) or dataset= and step=")
    if what_if:
        parse_what_if(what_if, Config(workers=1, batch_size=batch_size))  # fails before runs
    if data is not None:
        from unstall.analysis.measure.workload import builtin_workload

        work = builtin_workload(
            data, model=model, rate=rate, batch_size=batch_size, num_workers=num_workers
        )
    else:
        if step is None:
            raise ValueError("dataset= needs step=: a callable that trains on one batch")
        from unstall.analysis.measure.workload import Workload

        workers = num_workers if num_workers is not None else machine.cores_available()
        work = Workload(dataset, step, batch_size=batch_size, num_workers=workers, name="dataset")
    w0, s0 = QUICK_STEPS if quick else STEPS
    result = analyze_workload(
        work,
        warmup=w0 if warmup is None else warmup,
        steps=s0 if steps is None else steps,
        progress=progress,
    )
    return report_of(result, what_if=what_if, html_dir=html_dir)


def analyze_workload(
    work: Workload,
    *,
    warmup: int = 10,
    steps: int = 200,
    progress: Callable[[str], None] | None = None,
    on_step: Callable[[], None] | None = None,
) -> Analysis:
    """Measure ``work`` (the differential runs), derive its rates and price them."""
    # here, not at the top: the in-process runs import torch, which a script's analysis
    # (``unstall analyze -- python train.py``: the script's process has it) never needs
    from unstall.analysis.measure.differential import measure_workload

    m = measure_workload(work, warmup=warmup, steps=steps, progress=progress, on_step=on_step)
    return model_of(derive_workload(m))


def report_of(
    analysis: Analysis,
    *,
    what_if: str | None = None,
    html_dir: str | None = None,
    verified: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The report dict of an `Analysis`; with ``html_dir`` also the HTML, PNGs and trace."""
    advice = advise(ask(analysis, what_if))
    report = build_report(advice, html_dir=html_dir, verified=verified)
    if html_dir is not None:
        from unstall.analysis.report.html import write_report

        write_report(html_dir, report, analysis.runs["cold"].spans)
    return report


def analyze_script(
    command: Sequence[str],
    *,
    steps: int | None = None,
    warmup: int | None = None,
    quick: bool = False,
    what_if: str | None = None,
    html_dir: str | None = None,
    console: Any = None,
    min_s: float | None = None,
    verify: bool | None = None,
    run_timeout_s: float = RUN_TIMEOUT_S,
) -> dict[str, Any]:
    """Run ``command`` cold then synthetic (one run), and cached; return the report dict.

    Without ``quick`` (or with ``verify=True``) the script runs once more under the
    recommendation, and the report's ``verified`` compares prediction and measurement.
    A run still going after ``run_timeout_s`` is stopped whole, and the error says where
    each of its processes was (`unstall.analysis.measure.script.hang`).
    """
    from unstall.analysis.measure.script.verify import verify_recommendation
    from unstall.analysis.progress import progress_bar
    from unstall.analysis.recommend.loaders import against_verified
    from unstall.analysis.recommend.option import applied

    window = window_of(
        quick=quick, warmup=warmup, steps=steps, min_s=min_s, timeout_s=run_timeout_s
    )
    verify = (not quick) if verify is None else verify
    with progress_bar(console) as bar:
        # the runs known to come: the cold one (going on as the model alone) and the
        # verification; each further run the measurement starts (a separate synthetic or
        # cached one) adds itself
        task = bar.add_task("runs", total=1 + int(verify))
        measured = [0]  # runs the measurement started

        def progress(description: str | None) -> None:
            if description is None:
                bar.update(task, advance=1)
                return
            measured[0] += 1
            bar.update(task, description=description, total=int(verify) + measured[0])

        m = measure_script(command, window, quick=quick, progress=progress)
        a = ask(model_of(derive_script(m)), what_if)
        advice = advise(a)
        verified = None
        if verify:
            bar.update(task, description="verifying the recommendation")
            before = round(a.derived.measured, 2)
            rec = applied(advice.recommendation)  # an edit of the script is not run here
            verified = verify_recommendation(command, rec, before, window)
            verified.update(priced_at_verify_load(a, advice, verified))
            if verified.get("loaders") is not None or rec.get("other_loaders"):
                verified["loaders"] = against_verified(rec, verified.get("loaders"))
            bar.update(task, advance=1)
    report = build_report(advice, html_dir=html_dir, verified=verified)
    if html_dir is not None:
        from unstall.analysis.report.html import write_report

        write_report(html_dir, report, m.runs["cold"].spans)
    return report


def priced_at_verify_load(a: Analysis, advice: Any, verified: dict[str, Any]) -> dict[str, Any]:
    """``{"at_verify_load": {...}}``: the recommended option priced again with the cores other
    processes left during the verification (its ``workers["other_cores"]``), beside its
    error; {} when the verification did not measure them.

    On a machine other jobs share, the price holds the cores they left while the job was
    measured; the verification runs minutes later under another load. Priced at the
    verification's load, the error is the model's own; the report keeps both."""
    from dataclasses import replace

    others = (verified.get("workers") or {}).get("other_cores")
    remedy = advice.recommendation.get("remedy")
    measured = verified.get("measured_samples_per_s")
    if others is None or not measured or not verified.get("changed"):
        return {}
    d = a.derived
    cores = max(LEAST_CORES, float(a.measurement.cores) - float(others))
    again = advise(replace(a, derived=replace(d, rates=replace(d.rates, cores=cores))))
    if remedy is None:
        price = again.recommendation.get("predicted_samples_per_s")
    else:
        price = next((o.predicted for o in again.remedies if o.remedy == remedy), None)
    if not price:
        return {}
    return {
        "at_verify_load": {
            "cores_left": round(cores, 2),
            "cores_left_when_measured": round(d.rates.cores, 2),
            "predicted_samples_per_s": round(price, 1),
            "error": round(abs(price - measured) / measured, 4),
        }
    }
