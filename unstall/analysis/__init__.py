"""`unstall analyze`: where a training job's time goes, what would fix it, and the fix.

The differential method (DESIGN.md section 1) over the loader's known order:
synthetic (G), cached (prep stall), cold (fetch stall); rates G, P, F; a what-if
model; a recommendation; a report (terminal, JSON, HTML, Chrome trace).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from unstall.analysis.core import Analysis, analyze_workload
from unstall.analysis.model import Config, Rates, predict
from unstall.analysis.runs import Workload

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
        from unstall.analysis.model import parse_what_if

        parse_what_if(what_if, Config(workers=1, batch_size=batch_size))  # fails before runs
    if data is not None:
        from unstall.analysis.workload import builtin_workload

        work = builtin_workload(
            data, model=model, rate=rate, batch_size=batch_size, num_workers=num_workers
        )
    else:
        if step is None:
            raise ValueError("dataset= needs step=: a callable that trains on one batch")
        workers = num_workers if num_workers is not None else len(os.sched_getaffinity(0))
        work = Workload(dataset, step, batch_size=batch_size, num_workers=workers, name="dataset")
    w0, s0 = QUICK_STEPS if quick else STEPS
    result = analyze_workload(
        work,
        warmup=w0 if warmup is None else warmup,
        steps=s0 if steps is None else steps,
        progress=progress,
    )
    return report_of(result, what_if=what_if, html_dir=html_dir)


def report_of(
    result: Analysis, *, what_if: str | None = None, html_dir: str | None = None
) -> dict[str, Any]:
    """The report dict of an `Analysis`; with ``html_dir`` also the HTML, PNGs and trace."""
    from unstall.analysis.report import build_report

    report = build_report(result, what_if=what_if)
    if html_dir is not None:
        from unstall.analysis.html import write_report

        report["html"] = write_report(html_dir, report, result.runs["cold"].spans)
        report["trace"] = os.path.join(html_dir, "trace.json")
    return report


__all__ = ["Analysis", "Config", "Rates", "Workload", "analyze", "analyze_workload", "predict"]
