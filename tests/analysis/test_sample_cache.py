"""`unstall analyze` prices, recommends and verifies the whole-sample cache for an unedited
script whose Dataset opens its own files and prepares each sample deterministically
(tests/analysis/scripts/prep_train.py: 20 ms of CPU per sample on 2 workers, ~100 samples/s
against a model of 2,000/s: prep-bound by construction). From the second epoch a cached
sample costs a decode of its stored bytes, so the analyzer must recommend
``{"cache": {"size": ..., "hold": "samples"}}``; its verification fills the cache first (the
steady state from epoch 2); the config applies through ``unstall run --config`` unchanged.
The same dataset with a hidden draw (``random.random()`` in ``__getitem__``) is refused the
sample cache, and the report names the check that failed.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.analysis.conftest import run_analyze
from unstall.analysis.model.predict import Config, in_order_share, predict
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend.option import Job, choose
from unstall.analysis.recommend.samples import sample_cache_row
from unstall.analysis.report.words import row

SCRIPT = Path(__file__).resolve().parent / "scripts" / "prep_train.py"
FILES = 160
SIZE = 2048
OPTIONS = ["--steps", "12", "--warmup", "3", "--min-seconds", "3", "--quick"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """FILES files of SIZE distinct bytes, dated a minute back (the cache stores no file
    written in its last seconds)."""
    root = tmp_path_factory.mktemp("clips")
    old = time.time_ns() - 60 * 10**9
    for i in range(FILES):
        path = root / f"{i:04d}.bin"
        path.write_bytes(bytes((i * 7 + k) % 251 for k in range(SIZE)))
        os.utime(path, ns=(old, old))
    return root


#: A job of 20 ms of CPU per sample on 2 workers of 4 cores, its model at 20,000/s.
RATES = Rates(
    20000.0, prep_cpu_s=0.02, cores=4.0, sample_bytes=2048.0, bandwidth=math.inf, latency_s=0.0
)
BASE = Config(workers=2, batch_size=8)
FACTS = {"applies": True, "samples": 1000, "bytes_per_sample": 8192, "read_s": 0.0002}
FACTS.update(collate_s=0.0003, prep_s=0.018, how="checked")


def test_a_cached_sample_costs_its_read_and_collate_for_the_share_that_fits() -> None:
    job = Job(RATES, BASE, 95.0)
    full = sample_cache_row(job, FACTS, room=None)
    # 0.2 ms read + 0.3 ms collate per sample on 2 workers: 2 / 0.5 ms = 4,000/s
    assert full.predicted == pytest.approx(2 / 0.0005, rel=1e-3)
    want = predict(replace(RATES, prep_cpu_s=0.0005, sample_bytes=1.0), BASE)
    assert full.predicted == round(want.samples_per_s, 1) and full.bound == "prep"
    assert full.facts["share"] == 1.0
    assert full.config == {
        "kwargs": {"num_workers": 2, "cache": {"size": "64MiB", "hold": "samples"}}
    }
    entry = int(8192 * 1.25) + 4096  # the segment's bytes per entry
    half = sample_cache_row(job, FACTS, room=entry * 500)
    assert half.facts["share"] == 0.5
    # half the samples hit (0.2 ms), half are prepared (18 ms): batches of 8 vary by the mix,
    # sqrt(8 x 0.25 x 19.8 ms^2) / (8 x 10.25 ms) = 0.337, and torch's in-order delivery
    # idles the 2 workers by that (the loop's step is 0.4 ms of a worker's 82 ms batch)
    cv = math.sqrt(8 * 0.25 * (0.02 - 0.0002) ** 2) / (8 * (0.5 * 0.0002 + 0.5 * 0.02 + 0.0003))
    assert half.facts["batch_cv"] == pytest.approx(cv, abs=1e-3) and 0.33 < cv < 0.34
    kept = in_order_share(2, 2, cv, 0.0004 / (8 * (0.5 * 0.0005 + 0.5 * 0.02)))
    assert 0.95 < kept < 0.98
    assert half.predicted == pytest.approx(kept * 2 / (0.5 * 0.0005 + 0.5 * 0.02), rel=1e-3)
    assert full.facts["batch_cv"] == 0.0  # no read_cv measured: steady hits
    rec = {"kwargs": {"num_workers": 2}, "predicted_samples_per_s": 100.0}
    rec.update(measured_samples_per_s=95.0, predicted_current_samples_per_s=100.0)
    rec.update(config="workers=2,cache=0", changed=False)
    chosen = choose(rec, [full])
    assert chosen["remedy"] == "samples" and chosen["kwargs"] == full.config["kwargs"]
    assert chosen["config"] == "workers=2,cache=64MiB:samples"
    none = sample_cache_row(job, FACTS, room=entry * 10)
    assert none.predicted is None and row(none)["not_applicable"].startswith("the node's room")


def test_the_process_is_priced_at_its_loops_cost_per_sample_at_the_models_rate() -> None:
    """The job as it is ran 95 samples/s with its process at 1 ms of CPU per sample (mostly
    CPU per second); its loop at the model's rate costs 0.05 ms: the cached share pays that."""
    rates = replace(RATES, cores=1.0, proc_cpu_s=0.001)
    job = Job(rates, BASE, 95.0)
    slow = sample_cache_row(job, FACTS, room=None)
    fast = sample_cache_row(job, {**FACTS, "loop_s": 0.00005}, room=None)
    # one core shared by the workers and the process: 1 / (0.5 ms + the process's)
    assert slow.predicted == pytest.approx(1 / (0.0005 + 0.001), rel=1e-3)
    assert fast.predicted == pytest.approx(1 / (0.0005 + 0.00005), rel=1e-3)
    assert fast.facts["worker_cpu_ms_per_sample"]["process"] == 0.05
    entry = int(8192 * 1.25) + 4096
    half = sample_cache_row(job, {**FACTS, "loop_s": 0.00005}, room=entry * 500)
    assert half.facts["worker_cpu_ms_per_sample"]["process"] == pytest.approx(0.525)


def test_a_failed_check_is_said_and_never_priced() -> None:
    facts = {"applies": False, "check": "same output", "why": "dataset[3] differs"}
    out = row(sample_cache_row(Job(RATES, BASE, 95.0), facts, room=None))
    assert out["predicted_samples_per_s"] is None and out["check"] == "same output"
    assert out["not_applicable"] == (
        "its samples cannot be cached whole: the 'same output' check failed: dataset[3] differs"
    )


@pytest.mark.timed
@pytest.mark.timeout(280)
def test_prep_bound_script_gets_the_sample_cache(tmp_path, root):
    report = run_analyze(
        tmp_path, [*OPTIONS, "--verify"], [sys.executable, str(SCRIPT), str(root), "--epochs", "6"]
    )
    assert report["bottleneck"] == "prep", (report["stall"], report["runs"])
    rec = report["recommendation"]
    assert rec["remedy"] == "samples", rec
    cache = rec["kwargs"]["cache"]
    assert cache["hold"] == "samples" and rec["kwargs"]["num_workers"] == 2, rec
    (row,) = [r for r in report["remedies"] if r["remedy"] == "samples"]
    assert row["share"] == 1.0 and row["determinism"] == "checked", row
    # a float32 tensor of the file's bytes and an int label, as the codec stores them
    assert SIZE * 4 <= row["bytes_per_sample"] < SIZE * 4 + 1024, row
    per = row["worker_cpu_ms_per_sample"]
    assert per["dataset"] >= 15.0 and 0 < per["process"] < per["dataset"], row
    v = report["verified"]
    assert v["kwargs"] == rec["kwargs"], v
    assert v["cache"]["prefilled"] == {
        "stored": FILES,
        "files": FILES,
        "complete": True,
        "hold": "samples",
    }
    stats = v["cache"]["stats"]
    assert stats["level"] == "samples" and stats["items_cached"] == FILES, stats
    assert stats["misses"] == 0 and stats["hits"] > 0, stats
    assert v["measured_samples_per_s"] > 3 * report["measured_samples_per_s"], v
    # what the verification's workers spent per sample, and the option priced again at the
    # cores other processes left during it (the load may have changed since the analysis)
    assert v["workers"]["cpu_ms_per_sample"] > 0 and v["workers"]["other_cores"] >= 0, v
    again = v["at_verify_load"]
    assert again["cores_left_when_measured"] == round(report["rates"]["cores"], 2), again
    assert again["predicted_samples_per_s"] > 0, again
    err = abs(again["predicted_samples_per_s"] - v["measured_samples_per_s"])
    assert again["error"] == round(err / v["measured_samples_per_s"], 4), again

    # the config, as written, applies to the unchanged script through `unstall run --config`
    config, out = tmp_path / "c.json", tmp_path / "run.json"
    config.write_text(json.dumps({"kwargs": rec["kwargs"]}))
    command = [sys.executable, "-m", "unstall", "run", "--config", str(config), "--json", str(out)]
    command += ["--", sys.executable, str(SCRIPT), str(root), "--epochs", "2", "--cpu-ms", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    (loader,) = [r for p in json.loads(out.read_text())["processes"] for r in p["loaders"]]
    held = loader["cache"]
    assert loader["samples"] == 2 * FILES and held["level"] == "samples", loader
    # epoch 1 prepared and stored every sample, epoch 2 read each back
    assert held["items_cached"] == FILES and held["hits"] == FILES, held
    assert held["misses"] == FILES, held


@pytest.mark.timed
@pytest.mark.timeout(200)
def test_a_hidden_draw_is_refused_the_sample_cache(tmp_path, root):
    report = run_analyze(
        tmp_path, OPTIONS, [sys.executable, str(SCRIPT), str(root), "--epochs", "6", "--draw"]
    )
    assert report["bottleneck"] == "prep", (report["stall"], report["runs"])
    assert report["recommendation"].get("remedy") != "samples", report["recommendation"]
    (row,) = [r for r in report["remedies"] if r["remedy"] == "samples"]
    assert row["predicted_samples_per_s"] is None and row["unpriced"] == "not_deterministic"
    assert row["check"] == "generator untouched", row
    assert "'generator untouched' check failed" in row["not_applicable"], row
    assert "draws from random's global generator" in row["not_applicable"], row
