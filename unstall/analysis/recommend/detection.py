"""The ``detection`` remedy: a torchvision detection pipeline run as unstall's plan, priced.

``prep="lean"`` runs a dataset's ``transforms.v2`` detection pipeline as a plan (boxes
first, each output pixel made once: `unstall.adapt.detection`), applied to the unchanged
script by ``unstall run --config``. Its price is the job's measured rates with the CPU per
sample scaled by what the plan costs against the pipeline as it is, both timed on the job's
own samples with the same draws (`unstall.analysis.measure.script.detection`), through the
model (`unstall.analysis.model.predict`): a plan that costs more than the script's own
pipeline (a flip alone gains nothing to fold and pays the plan's bookkeeping) is priced
under the job, and `option.choose` does not take it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from unstall.analysis.model.predict import predict
from unstall.analysis.recommend.option import Job, Option, option


def detection_row(job: Job, probe: dict[str, Any]) -> Option:
    """The plan priced for ``job`` from ``probe`` (`detection_probe`'s figures), as a config
    at the job's own worker count (where it was priced); unpriced, with why, where the plan
    leaves the pipeline as it is."""
    config = {"kwargs": {"num_workers": job.base.workers, "prep": "lean"}}
    if probe.get("refused"):
        return option("detection", job.measured, unpriced="plan_refused", why=probe["refused"])
    rates = job.rates
    ratio = probe["plan_cpu_s"] / probe["own_cpu_s"]
    planned = replace(rates, prep_cpu_s=rates.prep_cpu_s * ratio)
    facts: dict[str, Any] = {
        "adapt": probe["adapt"],
        "plan": probe["plan"],
        "worker_cpu_ms_per_sample": {
            "now": round(rates.prep_cpu_s * 1e3, 3),
            "planned": round(rates.prep_cpu_s * ratio * 1e3, 3),
        },
        "probe": {k: round(probe[k], 6) for k in ("own_cpu_s", "plan_cpu_s")},
        "samples_timed": probe["samples"],
    }
    return option("detection", job.measured, predict(planned, job.base), config=config, **facts)
