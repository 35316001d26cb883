"""`unstall analyze` prices ``num_workers="auto"`` (issue 39): where the loader's own tuner
would settle on this job, less the batches it spends getting there, and recommends it where
a fixed count is fragile. The walk asks the tuner's rule (`unstall.loader.autotune.decide`),
so these figures follow from the model's windows and that rule, computed here again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.analysis.conftest import run_analyze
from unstall.analysis.model.predict import Config, predict
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend.auto import (
    MARGIN,
    auto_row,
    budget_at,
    next_window,
    price,
    settle,
    window_at,
)
from unstall.analysis.recommend.option import Job, replaced
from unstall.analysis.recommend.search import recommend
from unstall.analysis.report.words import row, undone_text
from unstall.loader.autotune.controller import AutoTuner
from unstall.loader.autotune.policy import FIRST_WINDOW_S, START_WORKERS, WARMUP_ROUNDS

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "analysis" / "scripts" / "burn_train.py"
CORES = len(os.sched_getaffinity(0))


def rates(cores: float, *, io_s: float = 0.0, proc_s: float = 0.0) -> Rates:
    """A prep-bound job: 4 ms of CPU per sample, a 2,000/s model."""
    return Rates(2000.0, 0.004, cores, 1.0, 1e12, io_s, proc_cpu_s=proc_s)


def option_of(r: Rates, workers: int, node_cores: int, **kw):
    """The ``auto`` option for a job of ``workers`` on ``node_cores``, and the search's
    recommendation it is priced against."""
    base = Config(workers=workers, batch_size=8)
    measured = kw.pop("measured", predict(r, base).samples_per_s)
    rec = recommend(r, base, 4096, measured, cache_room_bytes=None)
    over = {"oversubscribed": workers > node_cores, "cores": node_cores}
    job = Job(r, base, measured, unknown=kw.pop("unknown", {}))
    o = auto_row(
        job,
        rec,
        horizon_s=kw.pop("horizon_s", 20.0),
        node_cores=node_cores,
        oversubscription=over,
        **kw,
    )
    return o, rec


def row_of(r: Rates, workers: int, node_cores: int, **kw) -> dict:
    """The ``auto`` row as the report shows it."""
    return row(option_of(r, workers, node_cores, **kw)[0])


def test_oversubscribed_job_settles_at_the_cores_and_auto_is_recommended():
    # 8 workers on 2 cores: auto starts at START_WORKERS (1: 250/s, the loop waits 7/8 of
    # its time, one core idle) and grows to its rule's cap (2 CPU-bound workers on 2 cores)
    # after its unjudged batches (2 x 1 x prefetch 2) and its short first window (0.1 s at
    # 31.25 batches/s: the 6-batch minimum); the doubled rate pays
    assert START_WORKERS == 1
    r = rates(2.0)
    s = settle(r, Config(workers=8, batch_size=8), node_cores=2)
    assert (s.path, s.batches, s.settled, s.undone) == ([1, 2], [4 + 6], 2, None)
    assert s.whys == ["loop waits, cores free"]
    first = window_at(r, Config(workers=1, batch_size=8), prefetch=2, seconds=FIRST_WINDOW_S)
    assert first.batches == 6
    # 10 batches at 250/s instead of 500/s, and 1 x 2 prefetched batches made again
    assert s.lost_s == pytest.approx(10 * 8 * (1 / 250 - 1 / 500) + 2 * 8 / 500, rel=1e-6)
    # the job as measured: 480/s (8 workers waiting for 2 cores lose some of their 500/s);
    # were it measured at the model's full 500/s, no walk that changes the pool could match
    # it (any settling costs), and the fixed setting would stand
    row = row_of(r, 8, 2, measured=480.0)
    two = predict(r, Config(workers=2, batch_size=8)).samples_per_s
    assert two == pytest.approx(500.0)
    # over the 20 s run: 500 x 20 / (20 + 0.192 s lost), within 5 % of the fixed 500/s
    assert row["predicted_samples_per_s"] == round(two * 20 / 20.192, 1) == 495.2
    assert row["settles_on"] == 2 and row["settling"]["seconds_lost"] == 0.192
    assert row["settling"]["path"] == [1, 2] and row["settled_samples_per_s"] == 500.0
    assert row["recommended"] is True
    assert row["fragile"] == [
        "oversubscribed: the job asks 8 workers of 2 cores; a fixed count is right for one "
        "machine only"
    ]
    assert row["config"] == {"kwargs": {"num_workers": "auto"}}
    assert row["why"].startswith(f"within {MARGIN:.0%} of the best fixed setting")
    at_model = row_of(r, 8, 2)  # measured at the model's 500/s: 495.2 is below it
    assert at_model["recommended"] is False
    assert at_model["why"] == "predicted slower than the job as it is"


def test_growth_from_the_start_size_is_priced_as_lost_batches():
    # 16 free cores, a job asking 2: auto starts at 1 and grows to what the costs need
    # (a 34.4 ms task per batch over the loop's 4 ms: 9 workers) in one change, after its
    # unjudged batches and its short first window (0.1 s at 29 batches/s: the 6-batch minimum)
    r = replace(rates(16.0), prep_cpu_s=0.0043)
    base = Config(workers=2, batch_size=8)
    s = settle(r, base, node_cores=16)
    assert s.path == [1, 9] and s.settled == 9 and s.whys == ["loop waits, cores free"]
    w = window_at(r, replace(base, workers=1), prefetch=2, seconds=FIRST_WINDOW_S)
    assert w.batches == 6 and s.batches == [WARMUP_ROUNDS * 1 * 2 + 6] == [10]
    r1 = predict(r, replace(base, workers=1)).samples_per_s  # 1 / 4.3 ms
    r9 = predict(r, replace(base, workers=9)).samples_per_s  # the model's 2,000/s
    assert r1 == pytest.approx(1 / 0.0043) and r9 == 2000.0
    lost = 10 * 8 * (1 / r1 - 1 / r9) + 1 * 2 * 8 / r9  # + the remade prefetch
    assert s.lost_s == pytest.approx(lost, rel=1e-9) and lost == pytest.approx(0.312)
    assert price(s, 20.0) == pytest.approx(r9 * 20.0 / (20.0 + lost), rel=1e-9)
    row = row_of(r, 2, 16)
    assert row["settling"]["path"] == [1, 9] and row["settled_samples_per_s"] == 2000.0
    assert row["predicted_samples_per_s"] == round(price(s, 20.0), 1) < 2000.0
    # the best fixed count the model finds is this machine's 16 cores (8 would give 1,860/s):
    # fragile. Over a 20 s run auto's settling (0.31 s) keeps it within the margin:
    # recommended; over 3 s the same settling costs more than the margin: a priced row only
    assert row["best_fixed"]["kwargs"] == {"num_workers": 16}
    assert row["fragile"] == [
        "the best fixed count is this machine's 16 cores: another machine needs another count"
    ]
    assert row["recommended"] is True and row["settling"]["seconds_lost"] == 0.312
    short = row_of(r, 2, 16, horizon_s=3.0)
    assert short["predicted_samples_per_s"] == round(price(s, 3.0), 1) < 0.95 * 2000
    assert short["recommended"] is False and short["why"].startswith("more than 5% below")


def test_ranks_on_one_node_share_the_cores():
    # 2 ranks on 4 cores: each tuner starts at 1 and grows within its share (4 // 2: the
    # costs alone would ask 8), never to all 4
    r = rates(4.0)
    s = settle(r, Config(workers=4, batch_size=8), node_cores=4, ranks=2)
    assert s.path == [1, 2] and s.settled == 2 and s.whys == ["loop waits, cores free"]
    row = row_of(r, 4, 4, ranks=2)
    assert "2 ranks share this node" in " ".join(row["fragile"])


def test_training_process_cores_come_off_the_budget():
    # the training process spends 4 ms of CPU per sample too: at 250/s (its start of 1
    # worker) it keeps a core busy, so the tuner's budget is the one core left and it stays
    # at 1, where without that cost (test_oversubscribed_...) it grows to 2 on 2 cores
    r = rates(2.0, proc_s=0.004)
    one = Config(workers=1, batch_size=8)
    assert budget_at(r, one, node_cores=2, ranks=1, others=0.0).cores == 1
    assert budget_at(rates(2.0), one, node_cores=2, ranks=1, others=0.0).cores == 2
    s = settle(r, Config(workers=2, batch_size=8), node_cores=2)
    assert (s.path, s.batches, s.whys, s.lost_s) == ([1], [], [], 0.0)


def test_a_grow_that_pays_neither_way_is_undone():
    # 1.5 cores' worth of 4 ms prep (375/s) under a 400/s model, on a 4-core node: from 1
    # worker (250/s) the costs ask 2 (32 ms task / 20 ms per batch of the loop): 1.5x, paid.
    # At 2 the loop still waits 6.25 % (> GROW_WAIT) with cores idle: the rule asks 3, which
    # the cores cap at the same 375/s and the same wait: neither 5 % more rate nor the wait
    # halved (nor under 2 %): undone, 2 stays
    r = Rates(400.0, 0.004, 1.5, 1.0, 1e12, 0.0)
    s = settle(r, Config(workers=2, batch_size=8), node_cores=4)
    assert (s.path, s.batches, s.settled) == ([1, 2], [WARMUP_ROUNDS * 1 * 2 + 6], 2)
    assert s.whys == ["loop waits, cores free"] * 2
    assert (
        s.undone == ("grow", 3, 3)
        and undone_text(s.undone)
        == "a grow to 3 would neither raise the rate 1.05x nor halve the loop's wait: undone"
    )
    # 10 batches at 250/s, not 375/s; 2 and 3 workers run at the settled rate; prefetched
    # batches made again: 1 x 2 (1 -> 2), 2 x 2 (2 -> 3), 3 x 2 (3 -> 2)
    assert s.lost_s == pytest.approx(10 * 8 * (1 / 250 - 1 / 375) + 12 * 8 / 375, rel=1e-6)


def test_unmeasured_prep_is_not_priced():
    row = row_of(rates(2.0), 8, 2, unknown={"prep": "no worker timings"})
    assert row["predicted_samples_per_s"] is None and row["recommended"] is False
    assert row["not_measured"] == "not priced: no worker timings"


def test_recommendation_as_auto_keeps_the_fixed_one_beside_it():
    r = rates(2.0)
    base = Config(workers=8, batch_size=8)
    o, rec = option_of(r, 8, 2, measured=480.0)
    assert rec == recommend(r, base, 4096, 480.0, cache_room_bytes=None)
    out = replaced(rec, o)
    assert out["kwargs"] == {"num_workers": "auto"} and out["changed"] is True
    assert out["config"] == "workers=auto(2),cache=0" and out["remedy"] == "auto"
    assert out["predicted_samples_per_s"] == o.predicted == 495.2
    assert out["instead"]["kwargs"] == rec["kwargs"]
    assert out["auto"]["settles_on"] == 2 and "why_unchanged" not in out


@pytest.mark.timeout(400)
def test_oversubscribed_script_gets_auto_priced_applied_and_verified(tmp_path):
    """A prep-bound script asking 4x its cores in workers (x prefetch 4: the start-up burst
    shape): "auto" is priced on the page with the reason it is or is not recommended, the
    config of its row runs under `unstall run --config`, and where it is recommended the
    verification lands within 15 % of the price.

    Whether it is recommended here depends on the machine: the model puts the 2 workers the
    tuner settles on at or a little under what the 8 measured (469 against 484/s on this
    2-core VM, loaded), and a recommendation is never priced under the job as it is."""
    workers = 4 * CORES
    command = [sys.executable, str(SCRIPT), "--workers", str(workers), "--prefetch", "4"]
    command += ["--pin-memory", "--cpu-ms", "4", "--samples", "2048", "--epochs", "6"]
    options = ["--quick", "--verify", "--min-seconds", "4"]
    report = run_analyze(tmp_path, options, command, timeout=300)
    assert report["bottleneck"] == "prep", report["summary"]
    (row,) = [r for r in report["remedies"] if r["remedy"] == "auto"]
    rec = report["recommendation"]
    assert row["predicted_samples_per_s"] > 0 and row["settles_on"] <= CORES, row
    assert row["fragile"][0].startswith(f"oversubscribed: the job asks {workers} workers")
    assert row["config"] == {"kwargs": {"num_workers": "auto"}}
    start = min(START_WORKERS, CORES)
    assert row["settling"]["path"][0] == start, row
    # the price: the settled pool's model rate less the settling, never above it
    assert row["predicted_samples_per_s"] <= row["settled_samples_per_s"], row
    page = (tmp_path / "html" / "index.html").read_text()
    state = "recommended" if row["recommended"] else "priced"
    assert f"data-remedy='auto' data-state='{state}'" in page, state
    assert f"{row['predicted_samples_per_s']:,.0f}" in page
    if not row["recommended"]:  # it says why, and the fixed recommendation stands
        assert row["why"] and rec["kwargs"].get("num_workers") != "auto", (row, rec)
    else:
        assert rec["kwargs"] == {"num_workers": "auto"}, rec
        assert rec["predicted_samples_per_s"] == row["predicted_samples_per_s"]
        assert rec["instead"]["kwargs"] == row["best_fixed"]["kwargs"]
        config = tmp_path / "html" / "recommendation.json"
        assert json.loads(config.read_text())["kwargs"] == {"num_workers": "auto"}
        # verified: run under the file's settings, the tuner's walk reported, and no slower
        # than the job as it is beyond the run-to-run spread (the analyzer's own verdict).
        # The price promises at most 15 % more than the re-run gives once what is not
        # auto's is taken off: the model's own error on the job as it is (`model_check`),
        # and where the re-run looked slower, the machine's drift between the job's runs
        v = report["verified"]
        assert v["kwargs"] == {"num_workers": "auto"}
        assert v["autotune"]["path"][0] == start and v["autotune"]["settled_on"] <= CORES
        assert "did not hold" not in v["verdict"], v
        check = report["model_check"]
        model = min(1.0, check["measured_samples_per_s"] / check["predicted_samples_per_s"])
        control = v.get("control_samples_per_s", v["before_samples_per_s"])
        drift = control / v["before_samples_per_s"]
        assert v["predicted_samples_per_s"] * model * drift <= 1.15 * v["measured_samples_per_s"]
    # the row's config applied by `unstall run --config`: the script's loader runs "auto"
    config = tmp_path / "auto.json"
    config.write_text(json.dumps(row["config"]))
    out = tmp_path / "run.json"
    short = [*command[:2], "--workers", str(workers), "--cpu-ms", "1", "--samples", "256"]
    run = [sys.executable, "-m", "unstall", "run", "--json", str(out), "--config", str(config)]
    done = subprocess.run([*run, "--", *short, "--epochs", "1"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (loader,) = json.loads(out.read_text())["processes"][0]["loaders"]
    # it asked for 4x the cores; "auto" started at START_WORKERS and ran within the cores
    # (whether it grew in its 32 batches depends on the idle cores it saw)
    assert loader["samples"] == 256 and start <= loader["num_workers"] <= CORES, loader


def _controller_walk(r: Rates, base: Config, node_cores: int) -> list[int]:
    """The live tuner (`AutoTuner`) fed, window after window, the windows the model predicts
    for its pool under the budget `budget_at` gives: the counts it runs, in order."""
    tuner = AutoTuner(True, False, START_WORKERS, 2)
    try:
        now, walk = 0.0, [tuner.workers]
        for _ in range(16):
            at = replace(base, workers=tuner.workers)
            w = next_window(r, at, 2, tuner._walk)
            budget = budget_at(r, at, node_cores=node_cores, ranks=1, others=0.0)
            tuner._measure_budget = lambda w, cpu, b=budget: b
            tuner._batches, tuner._wait, tuner._busy = w.batches, w.wait_s, w.busy_s
            tuner._cpu, tuner._runq = w.cpu_s, w.runq_s
            now += w.wall_s
            tuner._w0 = now - w.wall_s
            tuner._close_window(now)
            d, tuner._pending = tuner._pending, None
            if d is not None:  # what `apply` does at the next pull
                tuner.workers, tuner.prefetch = d.workers, d.prefetch
                walk.append(d.workers)
            elif not tuner._walk.shrink_votes and tuner._walk.pending is None:
                break
        return walk
    finally:
        tuner.close()


@pytest.mark.parametrize(
    ("r", "workers", "node_cores"),
    [
        (rates(2.0), 8, 2),  # grows 1 -> 2
        (replace(rates(16.0), prep_cpu_s=0.0043), 2, 16),  # grows 1 -> 9
        (Rates(400.0, 0.004, 1.5, 1.0, 1e12, 0.0), 2, 4),  # 1 -> 2 -> 3, undone: 2
        (rates(2.0, proc_s=0.004), 2, 2),  # stays at 1
    ],
)
def test_the_live_tuner_fed_the_models_windows_walks_as_the_price_does(r, workers, node_cores):
    base = Config(workers=workers, batch_size=8)
    s = settle(r, base, node_cores=node_cores)
    assert _controller_walk(r, base, node_cores) == s.walk
    if s.undone:
        assert s.walk == [1, 2, 3, 2] and s.path == [1, 2]
