"""What every benchmark shares: timing a loader under a simulated accelerator, results, output.

A benchmark compares the baseline (torch's DataLoader) and unstall side by side
in the same run, on the same data and pipeline, and reports the ratio.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from unstall import machine
from unstall.models.simulated import SimulatedAccelerator


@dataclass
class Measurement:
    """One loader run: samples, wall time and where it went [Unit: second]."""

    samples: int
    wall_s: float
    wait_s: float
    compute_s: float
    batches: int

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def stall_fraction(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        out = asdict(self)
        out["samples_per_s"] = round(self.samples_per_s, 2)
        out["stall_fraction"] = round(self.stall_fraction, 4)
        return out


def measure(
    loader: Iterable[Any],
    *,
    rate: float | None = None,
    max_batches: int | None = None,
    skip_batches: int = 0,
    on_batch: Callable[[int], None] | None = None,
) -> Measurement:
    """Iterate ``loader`` once, feeding a `SimulatedAccelerator` at ``rate`` samples/s.

    The wall clock starts when the first batch is asked for, so worker start-up
    counts, as it does in training. ``skip_batches`` first batches are consumed
    before timing starts (warm-up); ``max_batches`` bounds the run; ``on_batch``
    gets each batch's sample count (for progress bars).
    """
    accel = SimulatedAccelerator(rate)
    it = iter(loader)
    for _ in range(skip_batches):
        if next(it, None) is None:
            break
    wait = 0.0
    batches = 0
    start = time.perf_counter()
    while max_batches is None or batches < max_batches:
        t0 = time.perf_counter()
        batch = next(it, None)
        if batch is None:
            break
        wait += time.perf_counter() - t0
        before = accel.samples
        accel.step(batch)
        batches += 1
        if on_batch is not None:
            on_batch(accel.samples - before)
    wall = time.perf_counter() - start
    del it
    return Measurement(
        samples=accel.samples, wall_s=wall, wait_s=wait, compute_s=accel.busy_s, batches=batches
    )


def median_of(runs: list[Measurement]) -> Measurement:
    """The run with the median throughput (a real run, not an average of runs)."""
    ordered = sorted(runs, key=lambda m: m.samples_per_s)
    return ordered[len(ordered) // 2]


@dataclass
class BenchResult:
    """A benchmark's figures; ``ratio`` is the headline: unstall over the baseline."""

    name: str
    ratio: float
    baseline: dict[str, Any]
    unstall: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = {
            "benchmark": self.name,
            "ratio": round(self.ratio, 4),
            "baseline": self.baseline,
            "unstall": self.unstall,
            "rows": self.rows,
            "notes": self.notes,
            "machine": machine_info(),
        }
        out.update(self.detail)
        return out


def row(case: str, loader: str, m: Measurement, ratio: float | None = None, **extra: Any) -> dict:
    """A table row for one measurement."""
    out: dict[str, Any] = {
        "case": case,
        "loader": loader,
        "samples_per_s": round(m.samples_per_s, 1),
        "stall_pct": round(100 * m.stall_fraction, 1),
        "ratio": None if ratio is None else round(ratio, 3),
    }
    out.update(extra)
    return out


def machine_info() -> dict[str, Any]:
    import torch

    return {
        "cpus": machine.cpus_installed(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
    }


def print_result(result: BenchResult, console: Any = None) -> None:
    """Print the rows as a table, then the headline ratio and notes."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"unstall bench {result.name}")
    columns: list[str] = []
    for r in result.rows:
        for k in r:
            if k not in columns:
                columns.append(k)
    for c in columns:
        table.add_column(
            c.replace("_", " "), justify="left" if c in ("case", "loader") else "right"
        )
    for r in result.rows:
        table.add_row(*(_fmt(r.get(c)) for c in columns))
    console.print(table)
    console.print(f"[bold]ratio (unstall / baseline): {result.ratio:.3f}x[/bold]")
    for note in result.notes:
        console.print(f"  {note}")


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, list):
        return " ".join(_fmt(v) for v in value)
    return str(value)


def write_json(result: BenchResult, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result.to_json(), f, indent=2)
        f.write("\n")


def repeat(fn: Callable[[], Measurement], times: int) -> list[Measurement]:
    return [fn() for _ in range(times)]


def ratio_of(a: float, b: float) -> float:
    return a / b if b > 0 else float("inf")


def median(values: list[float]) -> float:
    return statistics.median(values)


@contextlib.contextmanager
def frozen_heap() -> Iterator[None]:
    """Inside the block, full collections walk only the objects made inside it.

    A bench collects after each run (its loader's cycles freed before the next one); with
    torch imported that walks ~200k objects, 0.3-0.5 s a collection on a busy 2-core machine,
    more than a tiny run. The objects alive on entry are not the runs' garbage: they are
    frozen (`gc.freeze`) until the block ends.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def read_all(root: str | os.PathLike[str]) -> int:
    """Read every file under ``root`` once, so the page cache is warm before any timed run;
    their bytes."""
    total = 0
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                total += len(f.read())
    return total


T = TypeVar("T")


def rotate(
    sides: Mapping[str, Callable[[], T]],
    rounds: int,
    on_round: Callable[[int, list[str], dict[str, T]], None] | None = None,
) -> dict[str, list[T]]:
    """Run each of ``sides`` once a round, ``rounds`` times, the order rotating by one side
    a round (two sides: baseline first, then candidate first, ...), so that a machine whose
    load changes over the bench weighs on every side alike; each side's results, in round
    order. ``on_round(i, order, results)`` gets round ``i``'s order and results (progress)."""
    names = list(sides)
    runs: dict[str, list[T]] = {name: [] for name in names}
    for i in range(rounds):
        k = i % len(names)
        order = names[k:] + names[:k]
        for name in order:
            runs[name].append(sides[name]())
        if on_round is not None:
            on_round(i, order, {name: runs[name][-1] for name in names})
    return runs


@dataclass(frozen=True)
class Pairs:
    """The rates of a baseline and a candidate run back to back, pair by pair in run order.

    Each pair's ratio is taken within the pair (the load the two runs shared cancels); the
    headline is their median. Both sides' medians, and their ratio, are given too."""

    base: list[float]
    new: list[float]

    @property
    def ratios(self) -> list[float]:
        return [n / b for b, n in zip(self.base, self.new, strict=True)]

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def base_median(self) -> float:
        return statistics.median(self.base)

    @property
    def new_median(self) -> float:
        return statistics.median(self.new)

    @property
    def ratio_of_medians(self) -> float:
        return self.new_median / self.base_median


@dataclass(frozen=True)
class PairRuns(Generic[T]):
    """`run_pairs`' runs, each side's in run order, and their rates as `Pairs`."""

    base: list[T]
    new: list[T]
    rates: Pairs


def run_pairs(
    base: Callable[[], T],
    new: Callable[[], T],
    repeats: int,
    *,
    rate: Callable[[T], float],
    on_pair: Callable[[int, T, T], None] | None = None,
) -> PairRuns[T]:
    """``repeats`` pairs of runs of a bench's two sides, alternating which goes first
    (`rotate`); ``rate`` reads a run's samples/s; ``on_pair(i, base_run, new_run)`` after
    each pair (a bench's progress line)."""

    def each(i: int, _order: list[str], last: dict[str, T]) -> None:
        if on_pair is not None:
            on_pair(i, last["base"], last["new"])

    runs = rotate({"base": base, "new": new}, repeats, each)
    rates = Pairs([rate(r) for r in runs["base"]], [rate(r) for r in runs["new"]])
    return PairRuns(runs["base"], runs["new"], rates)


#: The source checkout this package runs from: its ``examples/`` are the unchanged scripts
#: benches run, and its root goes first on their ``PYTHONPATH`` (``python -m unstall`` in a
#: bench's runs is this package, not another install).
SOURCE_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = SOURCE_ROOT / "examples"


def check_example(script: Path, bench: str) -> None:
    """`FileNotFoundError` naming the bench where its example ``script`` is missing: the
    package is not run from a source checkout (an installed wheel has no ``examples/``)."""
    if not script.exists():
        raise FileNotFoundError(f"bench {bench} runs {script}: run it from a source checkout")


def script_env(**extra: str) -> dict[str, str]:
    """This process's environment for a bench's script: `SOURCE_ROOT` first on
    ``PYTHONPATH``, then the ``extra`` variables."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SOURCE_ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def under_unstall(config: str | os.PathLike[str], command: list[str]) -> list[str]:
    """``command`` run unchanged under ``unstall run --config config``."""
    return [sys.executable, "-m", "unstall", "run", "--config", os.fspath(config), "--", *command]


@dataclass(frozen=True)
class ScriptRun:
    """A bench script's run: what it printed, and the cores other processes kept busy."""

    stdout: str
    others_cores: float

    def samples_per_s(self) -> float:
        """The last ``samples/s: X`` line the script printed (the example scripts' own)."""
        found = re.findall(r"samples/s: ([0-9.]+)", self.stdout)
        if not found:
            raise RuntimeError(f"the script printed no samples/s: {self.stdout[-500:]}")
        return float(found[-1])


def run_script(command: list[str], env: dict[str, str], timeout: float) -> ScriptRun:
    """Run ``command`` to its end. Meanwhile, the cores other processes kept busy: the
    machine's busy time (``/proc/stat``) less this run's own, over the run's wall time (a
    shared machine moves wall-clock rates). A failed run raises `RuntimeError` with its
    exit status and the end of its stderr."""
    from unstall.analysis.measure.procstat import machine_busy_s

    busy0, ours0, t0 = machine_busy_s(), _children_cpu_s(), time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t0
    others = (machine_busy_s() - busy0) - (_children_cpu_s() - ours0)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2500:]}")
    return ScriptRun(done.stdout, max(0.0, others / wall) if wall > 0 else 0.0)


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
