"""issue 49 in the analyzer: lean recommended as a config where it pays, P never under the
delivered rate, no ``auto`` price over a window too short (pure functions: milliseconds); the
lean probe finds the files of unstall's own ImageFolder as of torchvision's (a few decodes)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import write_jpegs
from unstall.analysis.measure.lean import job_samples, lean_probe
from unstall.analysis.model.predict import Config, prep_capacity
from unstall.analysis.model.stage import delivered_floor, model_of
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend.option import Option, choose, option
from unstall.analysis.recommend.stage import unpriced_if_short
from unstall.analysis.report.words import row

REC = {
    "kwargs": {"num_workers": 2},
    "config": "workers=2",
    "changed": False,
    "predicted_samples_per_s": 300.0,
    "measured_samples_per_s": 290.0,
    "predicted_speedup": 1.0,
    "predicted_current_samples_per_s": 300.0,
    "why_unchanged": "no loader setting is predicted to beat the job as it is",
}


def _lean(predicted: float | None) -> Option:
    """The lean remedy for a recognized torchvision pipeline: a config at the job's 2 workers."""
    config = {"kwargs": {"num_workers": 2, "prep": "lean"}}
    why = None if predicted else "no_jpegs"
    return option("lean", 290.0, predicted, config=config, unpriced=why, adapt="ImageFolder")


def test_lean_becomes_the_recommendation_where_it_pays() -> None:
    rec = choose(REC, [_lean(900.0)])
    assert rec["kwargs"] == {"num_workers": 2, "prep": "lean"} and rec["changed"]
    assert rec["predicted_samples_per_s"] == 900.0 and rec["predicted_speedup"] == 3.0
    assert "why_unchanged" not in rec and rec["instead"]["kwargs"] == {"num_workers": 2}
    assert rec["remedy"] == "lean" and "edit" not in rec and "not_chosen" not in rec


def test_lean_is_not_recommended_where_it_does_not_pay_or_is_unpriced() -> None:
    rec = choose(REC, [_lean(310.0)])  # under 1.1x the best: said, not taken
    assert {k: v for k, v in rec.items() if k != "not_chosen"} == REC
    assert rec["not_chosen"] == [{"remedy": "lean", "predicted_speedup": 1.07, "reason": "gain"}]
    assert choose(REC, [_lean(None)]) is REC
    assert choose(REC, [_lean(305.0)]) is REC  # within the search's 3 %: not priced higher


def _measurement(workers: int, batch: int) -> SimpleNamespace:
    return SimpleNamespace(num_workers=workers, batch_size=batch, probe=None)


def test_p_is_never_under_the_delivered_rate() -> None:
    rates = Rates(ingestion=5030.0, prep_cpu_s=16 / 3632, cores=16.0, sample_bytes=1.0,
                  bandwidth=1e12, latency_s=0.0)  # fmt: skip
    m = _measurement(16, 256)
    base = Config(workers=16, batch_size=256, inflight=1, prefetch=False)
    assert prep_capacity(rates, base) < 5000
    notes: list[str] = []
    floored = delivered_floor(rates, m, 5000.0, notes)
    assert abs(prep_capacity(floored, base) - 5000.0) < 1.0
    assert notes and "delivered 5,000 samples/s" in notes[0]
    assert delivered_floor(floored, m, 5000.0, []) == floored  # already consistent: kept


def test_auto_is_not_priced_over_a_window_too_short() -> None:
    """The H200 case: settled at ~5,000/s, priced at 56/s over a 0.2 s window."""
    auto = option("auto", 5000.0, 56.0, config={"kwargs": {"num_workers": "auto"}},
                  settling={"seconds_lost": 17.6, "priced_over_s": 0.2}, why="fragile")  # fmt: skip
    short = unpriced_if_short(auto, 0.2)
    assert short.predicted is None and not short.eligible and "settling" not in short.facts
    shown = row(short)
    assert "0.2 s" in shown["not_measured"] and "17.6 s" in shown["not_measured"]
    assert shown["recommended"] is False and shown["config"] == auto.config
    assert unpriced_if_short(auto, 20.0) is auto


def test_lean_probe_finds_the_files_unstall_and_torchvision_folders_list(tmp_path, monkeypatch):
    """``unstall analyze --data`` measures unstall's ImageFolder: the probe reads its keys (the
    listing it already has, no walk of the folder again) and times the same ImagePipeline in
    uint8 beside it; torchvision's ImageFolder is found by its ``samples``."""
    from unstall.data import ImageFolder
    from unstall.pipeline import ImagePipeline

    root = write_jpegs(tmp_path, 6, classes=2, seed=0)
    (root / "c0" / "notes.txt").write_text("not an image")
    ours = ImageFolder(root, transform=ImagePipeline(112, flip_p=0.0))
    for walk in ("os.walk", "os.scandir", "os.listdir"):  # its own list, not the folder again
        monkeypatch.setattr(walk, _no_walk)
    found = job_samples(ours)
    assert found == [(str(root / ours.keys[i]), i) for i in range(6)]
    monkeypatch.undo()
    probe = lean_probe(ours, found)
    assert probe is not None and probe["samples"] == 6
    assert probe["own_cpu_s"] > 0 and probe["lean_cpu_s"] > 0
    assert probe["adapt"] is None and probe["adapt_refused"] is None  # not a torchvision one
    import torchvision  # here: 1.75 s to import, for this test only

    theirs = torchvision.datasets.ImageFolder(root)
    assert job_samples(theirs) == [(path, i) for i, (path, _) in enumerate(theirs.samples)]


def _no_walk(*args, **kwargs):
    raise AssertionError("the folder was walked again")


def test_data_mode_p_is_never_under_the_delivered_rate_either() -> None:
    """`unstall analyze --data`: workers timed at 10 ms of CPU a sample (P = 2 / 0.01 =
    200/s on 2 workers) that delivered 400/s: P is raised to the delivered rate, said once."""
    from unstall.analysis.measure.machine import Machine
    from unstall.analysis.measure.result import Measurement, Run
    from unstall.analysis.rates.workload import derive_workload

    # a span: (.., start 3, .., end 5, CPU seconds 6, samples 7, run-queue seconds 8)
    spans = [(0.0, 0.0, 0.0, 0.0, 0.0, 0.08, 0.08, 8, 0.0)] * 100
    fast = Run("synthetic", 800, 0.4, 0.0, 0.4, 100, 0.0, step_s=[0.004] * 100)
    cold = Run("cold", 800, 2.0, 1.0, 1.0, 100, 0.0, spans=spans, step_s=[0.02] * 100)
    m = Measurement(
        workload="w",
        mode="workload",
        runs={"synthetic": fast, "cached": cold, "cold": cold},
        probe=None,
        num_workers=2,
        batch_size=8,
        num_samples=800,
        machine=Machine(2, None, False, None),
        split=False,
        cached_how="",
    )
    d = model_of(derive_workload(m)).derived  # the model stage floors P
    base = Config.of_job(m)
    assert prep_capacity(d.rates, base) >= 400.0 - 1.0
    assert [n for n in d.notes if "delivered 400 samples/s" in n], d.notes
