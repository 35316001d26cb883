"""The cold run goes on as the synthetic one in the same processes (one start of the script
for both); a script that ends before the model alone's window is whole gets a run of its own
for it. The runs are stood in for here: which runs start, and what the notes say."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from unstall.analysis.measure.script import runner

WINDOW = runner.window_of(quick=True, warmup=None, steps=None, min_s=None, timeout_s=60)


#: One batch's span as the loader's stats keep it: (the loop's wait start and end, worker id,
#: task start, fetch end, end, prepare CPU seconds, samples, run-queue seconds).
SPAN = [0.0, 0.001, 0, 0.0, 0.01, 0.02, 0.005, 8, 0.0]


def doc(
    mode: str,
    rank: int,
    *,
    complete: bool = True,
    steps: int = 20,
    after: str = "",
    evicted: bool = False,
    timeline: list | None = None,
) -> dict:
    """A run's document as the agent writes it (the fields the measurement reads)."""
    return {
        "mode": mode,
        "after": after,
        "rank": rank,
        "complete": complete,
        "steps": [[0.001, 0.01, 8]] * steps,
        "start": 0.0,
        "timeline": timeline or [],
        "stats": {"samples": 800},
        "num_workers": 2,
        "batch_size": 8,
        "burst": 4,
        "dataset": "Made",
        "evicted": evicted,
        "loaders": [],
        "files": [],
    }


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch):
    """Stand-ins for the script's runs: ``started`` lists each run's modes."""
    started: list[tuple[str, ...]] = []
    state: dict[str, Any] = {"synthetic": []}

    def run_modes(command, modes, window, *, config_path=None):
        started.append(tuple(modes))
        cold = [doc("cold", r, **state.get("cold", {})) for r in (0, 1)]
        return {"cold": cold, "synthetic": state["synthetic"]}

    def run_once(command, mode, window, *, config_path=None):
        started.append((mode,))
        return [doc(mode, r) for r in (0, 1)]

    monkeypatch.setattr(runner, "run_modes", run_modes)
    monkeypatch.setattr(runner, "run_once", run_once)
    return started, state


def test_one_run_for_the_cold_window_and_the_model_alone(runs):
    started, state = runs
    state["synthetic"] = [doc("synthetic", r, after="cold") for r in (0, 1)]
    m = runner.measure_script([sys.executable, "train.py"], WINDOW, quick=True)
    assert started == [("cold", "synthetic")]  # the cached run: the cold one stands for it
    assert any("timed in the cold run's own processes" in n for n in m.notes)
    assert m.runs["synthetic"].steps == 20


@pytest.mark.parametrize(
    "synthetic",
    [
        [],  # the script ended right after the cold window
        [doc("synthetic", 0, after="cold")],  # one rank of two
        [doc("synthetic", r, after="cold", complete=False) for r in (0, 1)],  # too short
    ],
)
def test_a_script_that_ends_first_gets_a_synthetic_run_of_its_own(runs, synthetic):
    started, state = runs
    state["synthetic"] = synthetic
    m = runner.measure_script([sys.executable, "train.py"], WINDOW, quick=True)
    assert started == [("cold", "synthetic"), ("synthetic",)]
    assert any("timed in a run of its own" in n for n in m.notes)


@pytest.mark.parametrize("timed", [True, False])
def test_quick_runs_the_cached_run_only_where_the_workers_were_not_timed(runs, timed):
    """The cold run's files evicted: with its workers timed per batch (their clocks split
    prepare from fetch) it stands for the cached run; without (no spans) a cached run starts."""
    started, state = runs
    state["synthetic"] = [doc("synthetic", r, after="cold") for r in (0, 1)]
    state["cold"] = {"evicted": True, "timeline": [SPAN] * 10 if timed else []}
    m = runner.measure_script([sys.executable, "train.py"], WINDOW, quick=True)
    reused = [n for n in m.notes if "no separate cached run" in n]
    if timed:
        assert started == [("cold", "synthetic")]
        assert reused and "the workers' own clocks split the cold run's time" in reused[0]
        assert m.runs["cached"].steps == m.runs["cold"].steps
    else:
        assert started == [("cold", "synthetic"), ("cached",)] and not reused
    # without --quick the cached run is its own, timed workers or not
    del started[:]
    runner.measure_script([sys.executable, "train.py"], WINDOW, quick=False)
    assert started == [("cold", "synthetic"), ("cached",)]
