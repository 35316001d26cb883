"""`unstall analyze` on the unedited ImageNet-shaped example (issue 26): it names prep, and
its recommendation, applied the way `unstall run --config` applies it, measures within 15 %
of its prediction and no slower than the job as it was."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.analysis.conftest import check_model_rate, run_analyze
from unstall.analysis.measure.script.verify import SPREAD
from unstall.analysis.recommend.option import applied
from unstall.data.synthetic import make_dataset

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "imagenet_like.py"
#: Noise allowed on "no slower than before" between two runs on a busy 2-core machine (the
#: analyzer's own verdict takes the same spread for noise).
NOISE = SPREAD


def rec_measured(report: dict) -> float:
    return report["recommendation"]["measured_samples_per_s"]


@pytest.mark.timeout(420)
def test_example_is_prep_bound_and_the_recommendation_holds(tmp_path):
    # ImageNet-shaped JPEGs (~500x375), rendered on every core (10 s on one here)
    data = tmp_path / "data"
    make_dataset(data, images=384, classes=4, seed=0, progress=False)
    cores = len(os.sched_getaffinity(0))
    options = ["--quick", "--verify", "--min-seconds", "3"]
    # epochs enough for the cold window and the model alone's after it in the same run (each
    # run stops once its window is whole)
    command = [sys.executable, str(EXAMPLE), str(data), "-b", "16", "--epochs", "40"]
    # more workers than cores, as on the H100 node; a model at 2,000 samples/s
    command += ["-j", str(2 * cores), "--rate", "2000"]
    report = run_analyze(tmp_path, options, command, timeout=400)
    assert report["bottleneck"] == "prep", report["summary"]
    assert report["prep_rate"] is not None and report["prep_rate"] < 2000
    check_model_rate(report, 2000)
    loaders = {r["dataset"]: r for r in report["loaders"]}
    assert [r["measured"] for r in report["loaders"]].count(True) == 1
    assert loaders["ImageFolderLike"]["batches"] > 0
    # the lean pipeline is priced on the job's own JPEGs beside its own __getitem__, the
    # GPU is said to be unmeasured
    lean = next(r for r in report["remedies"] if r["remedy"] == "lean")
    assert lean["probe"]["samples"] >= 4 and lean["probe"]["own_cpu_s"] > 0
    ratio = lean["probe"]["lean_cpu_s"] / lean["probe"]["own_cpu_s"]
    cpu = lean["worker_cpu_ms_per_sample"]
    assert cpu["lean"] == pytest.approx(cpu["now"] * ratio, rel=0.01)
    gpu = next(r for r in report["remedies"] if r["remedy"] == "gpu")
    assert gpu["predicted_samples_per_s"] is None and "not measured" in gpu["not_measured"]
    assert report["recommendation"]["predicted_samples_per_s"] >= rec_measured(report)
    # what --verify runs: the recommendation, or where it is an edit of the script (the lean
    # pipeline in place of the example's own dataset), the loader setting it keeps
    rec = applied(report["recommendation"])
    v = report["verified"]
    assert v["kwargs"] == rec["kwargs"]
    assert v["changed"] == rec["changed"]
    if rec["changed"]:
        # the prediction promises at most 15 % more than the re-run gives (against the job
        # re-run just after when the machine slowed between the runs); a re-run faster than
        # predicted is this 2-core machine's run-to-run spread (403 then 512/s with the same
        # 4 workers, in CI here), not a wrong claim
        drift = v["before_samples_per_s"] / v.get(
            "control_samples_per_s", v["before_samples_per_s"]
        )
        assert v["predicted_samples_per_s"] <= 1.15 * drift * v["measured_samples_per_s"], v
        # no slower than the job as it was, or (when the re-run looked slower) than the job
        # re-run right after it: the machine's drift between runs is not the recommendation's
        reference = v.get("control_samples_per_s", v["before_samples_per_s"])
        assert v["measured_samples_per_s"] >= (1 - NOISE) * reference, v
        assert ("control_samples_per_s" in v) == (
            v["measured_samples_per_s"] < (1 - NOISE) * v["before_samples_per_s"]
        ), v
    else:
        # the job's own settings kept: the "prediction" is the job's measured rate (or the
        # model's figure for it, if higher), and the re-run is the same job: its figure is
        # the machine's spread (451 then 364/s in CI here), not a claim to hold to 15 %
        assert "keeps the job's settings" in v["verdict"] and "control_samples_per_s" not in v
        current = max(rec["predicted_current_samples_per_s"], v["before_samples_per_s"])
        assert v["predicted_samples_per_s"] == pytest.approx(current, rel=0.01), (v, rec)
        assert v["measured_samples_per_s"] >= 0.5 * v["before_samples_per_s"], v
