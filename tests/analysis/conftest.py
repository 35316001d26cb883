"""Workloads with known ground truth: set G, set prepare CPU per sample, set storage."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from unstall.analysis.measure.workload import Workload
from unstall.data import FileDataset
from unstall.models.simulated import SimulatedAccelerator
from unstall.stores.local import LocalStore
from unstall.testing.throttle import ThrottledStore


class Burn:
    """A transform that costs exactly ``cpu_s`` of CPU per sample (on the thread's clock)."""

    def __init__(self, cpu_s: float):
        self.cpu_s = cpu_s

    def __call__(self, raw: bytes) -> torch.Tensor:
        end = time.thread_time() + self.cpu_s
        x = 0
        while time.thread_time() < end:
            x += 1
        return torch.tensor([len(raw)])


def write_files(root: Path, n: int, size: int) -> list[str]:
    keys = [f"s{i:05d}.bin" for i in range(n)]
    for i, key in enumerate(keys):
        (root / key).write_bytes(os.urandom(size - 8) + i.to_bytes(8, "little"))
    return keys


def make_workload(
    root: Path,
    keys: list[str],
    *,
    rate: float,
    prep_s: float,
    bytes_per_s: float,
    latency_s: float = 0.0,
    batch_size: int = 8,
    workers: int = 2,
) -> Workload:
    store = ThrottledStore(LocalStore(root), bytes_per_s=bytes_per_s, latency_s=latency_s)
    dataset = FileDataset(store, keys, transform=Burn(prep_s))
    accel = SimulatedAccelerator(rate)
    return Workload(dataset, accel.step, batch_size=batch_size, num_workers=workers, name="truth")


@pytest.fixture(scope="module")
def truth_files(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, list[str]]]:
    """640 files of 20 KB, written once for the module's workloads (which only read them)."""
    root = tmp_path_factory.mktemp("truth")
    yield root, write_files(root, 640, 20_000)


def own_segments() -> set[str]:
    """unstall's shared-memory files made by this process (others may run tests beside us)."""
    pid = str(os.getpid())
    return {n for n in os.listdir("/dev/shm") if "unstall" in n and pid in n}


@pytest.fixture(autouse=True)
def shm_clean() -> Iterator[None]:
    before = own_segments()
    yield
    left = own_segments() - before
    assert not left, f"left in /dev/shm: {sorted(left)}"


@pytest.fixture
def own_shm_dir(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A shared-memory directory of this test's own (``$UNSTALL_SHM_DIR``, inherited by the
    runs it starts): every slot and segment unstall makes there is the test's, so "nothing
    left behind" is checked on it alone while other tests run beside (the parallel half).
    Removed after, with whatever a failing test left in it."""
    import shutil
    import uuid

    path = Path("/dev/shm") / f"ustest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    monkeypatch.setenv("UNSTALL_SHM_DIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


ROOT = Path(__file__).resolve().parents[2]


def analyze_here(cwd: Path, argv: list[str], *, pythonpath: str = "") -> tuple[int, str]:
    """``unstall ARGV`` run by the CLI's own `main` in this process, from ``cwd``, with
    ``PYTHONPATH`` the checkout (and ``pythonpath``) as a shell started from it would have:
    (exit code, what it printed). The script's runs are processes of their own as ever; the
    analyzer is not (no interpreter, torch or matplotlib started again per analysis)."""
    import contextlib
    import io

    from unstall.cli import main

    printed = io.StringIO()
    before = os.environ.get("PYTHONPATH")
    here = os.getcwd()
    os.environ["PYTHONPATH"] = ":".join(filter(None, [str(ROOT), pythonpath]))
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(printed):
            code = main(argv)
    finally:
        os.chdir(here)
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    return code, printed.getvalue()


def run_analyze(
    tmp_path: Path,
    options: list[str],
    command: list[str],
    *,
    timeout: float = 280,
    pythonpath: str = "",
) -> dict:
    """``unstall analyze OPTIONS --json F --html D -- COMMAND`` (`analyze_here`); its report."""
    import json

    out = tmp_path / "report.json"
    argv = [
        "analyze",
        # a run that hangs fails the test with where each process was, within its time
        "--run-timeout",
        str(min(100, timeout / 2)),
        *options,
        "--json",
        str(out),
        "--html",
        str(tmp_path / "html"),
        "--",
        *command,
    ]
    code, printed = analyze_here(tmp_path, argv, pythonpath=pythonpath)
    assert code == 0, printed
    return json.loads(out.read_text())


def check_model_rate(report: dict, g: float) -> None:
    """G is the model's rate alone (``g`` within 10 %), or, where the model ran slower beside
    the loader's workers (more than 2 cores' worth of work here: its sleeps wake late), its
    rate in the job, with a note saying so; never more than alone."""
    alone = report["ingestion_rate_alone"]
    assert alone == pytest.approx(g, rel=0.10), report["runs"]
    slowed = [n for n in report["notes"] if "beside the loader" in n]
    if not slowed:
        assert report["ingestion_rate"] == pytest.approx(alone, rel=0.02), report["runs"]
        return
    from unstall.analysis.rates.script import MODEL_SLOWED

    rate = report["ingestion_rate"]
    # slower than alone, and never slower than the job itself (the job cannot outrun its
    # model). How late the model's sleeps woke beside the workers is the scheduler's doing: a
    # floor of half its rate alone failed on a loaded core (699-987/s against 2,000 alone, 4
    # workers pinned beside it, the other core busy)
    assert report["measured_samples_per_s"] <= rate < MODEL_SLOWED * alone, report["runs"]
    assert f"{rate:,.0f} samples/s beside the loader against {alone:,.0f}/s" in slowed[0]


def derived_of(num_workers: int, rates, *, stall, measured, unknown) -> Any:
    """A prep-bound `Derived` over one made-up 800-sample run (no script run): what the report's
    pure parts (headline, unknown rates) are tested on."""
    from unstall.analysis.measure.machine import Machine
    from unstall.analysis.measure.result import Measurement, Run
    from unstall.analysis.rates.result import Derived

    run = Run("cold", 800, 2.0, 1.0, 1.0, 100, 0.0, step_s=[0.02] * 100)
    m = Measurement(
        workload="w",
        mode="workload",
        runs={"synthetic": run, "cached": run, "cold": run},
        probe=None,
        num_workers=num_workers,
        batch_size=8,
        num_samples=800,
        machine=Machine(2, None, False, None),
        split=False,
        cached_how="",
    )
    measured = run.samples_per_s if measured is None else measured
    return Derived(
        measurement=m,
        rates=rates,
        stall=stall,
        measured=measured,
        fetch_rate=None,
        bottleneck="prep",
        unknown=unknown,
    )
