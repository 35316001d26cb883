"""Each loader's stall figures at exit: written per process, summarised by the first.

Every process of an ``unstall run`` that made a loader writes
``$UNSTALL_RUN_DIR/<pid>.json``; the run's first process (the one `unstall run`
became) prints one table over all of them at its exit (a torchrun job: one row
per rank and loader) and, with ``--json``, writes them to a file.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import weakref
from pathlib import Path
from typing import Any

from unstall.loader import hooks

_START = time.time()


class _Watcher:
    """A `hooks.Observer` keeping each loader's latest stats (kept after the loader is gone)."""

    def __init__(self) -> None:
        self.records: dict[int, dict[str, Any]] = {}  # loader number -> its summary
        self.live: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()

    def created(self, loader: Any) -> None:
        number = len(self.records)
        self.live[loader] = number
        self.records[number] = describe(loader, number)

    def batch(self, loader: Any, wait_s: float) -> None:
        pass

    def finished(self, loader: Any) -> None:
        number = self.live.get(loader)
        if number is not None:
            self.records[number] = describe(loader, number)

    def refresh(self) -> list[dict[str, Any]]:
        for loader, number in list(self.live.items()):
            self.records[number] = describe(loader, number)
        return [self.records[n] for n in sorted(self.records)]


_watcher: _Watcher | None = None


def watch() -> None:
    """Start recording every unstall loader this process makes."""
    global _watcher
    if _watcher is None:
        _watcher = _Watcher()
        hooks.add_observer(_watcher)


def describe(loader: Any, number: int) -> dict[str, Any]:
    """One loader's figures: batches, stall share, fetch and prepare per batch, throughput."""
    s = loader.stats()
    batches = s["batches"]
    # A dataset that does not separate fetching from preparing records fetch as 0: unknown.
    fetch_ms = s["fetch"].get("mean_ms") if s["fetch"].get("total_s") else None
    prep_ms = s["prep"].get("mean_ms", 0.0) if s["prep"]["count"] else None
    return {
        "loader": number,
        "dataset": type(loader.dataset).__name__,
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "batches": batches,
        "samples": s["samples"],
        "wall_s": s["wall_s"],
        "wait_s": s["wait_s"],
        "wait_share": s["stall_fraction"],
        "wait_ms_per_batch": round(1e3 * s["wait_s"] / batches, 3) if batches else 0.0,
        "fetch_ms_per_batch": fetch_ms,
        "prep_ms_per_batch": prep_ms,
        "samples_per_s": s["samples_per_s"],
        "main_cpu_ms_per_batch": s.get("main_cpu_ms_per_batch"),
    }


def write_own() -> None:
    """Write this process's loaders to ``$UNSTALL_RUN_DIR/<pid>.json`` (none made: nothing)."""
    run_dir = os.environ.get("UNSTALL_RUN_DIR")
    if _watcher is None or not run_dir or not _watcher.records:
        return
    doc = {
        "pid": os.getpid(),
        "rank": _env_int("RANK"),
        "local_rank": _env_int("LOCAL_RANK"),
        "argv": sys.argv,
        "process_wall_s": round(time.time() - _START, 3),
        "loaders": _watcher.refresh(),
    }
    path = Path(run_dir) / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)


def collect(run_dir: str | Path) -> list[dict[str, Any]]:
    """Every process's report in ``run_dir``, ranks first in order, then by pid."""
    docs = []
    for path in Path(run_dir).glob("*.json"):
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(docs, key=lambda d: (d["rank"] is None, d["rank"] or 0, d["pid"]))


def print_summary() -> None:
    """At the run's end: one table of all processes' loaders (stderr), and ``--json``."""
    run_dir = os.environ["UNSTALL_RUN_DIR"]
    docs = collect(run_dir)
    out_json = os.environ.get("UNSTALL_RUN_JSON")
    if out_json:
        Path(out_json).write_text(json.dumps({"processes": docs}, indent=2))
    shutil.rmtree(run_dir, ignore_errors=True)
    sys.stderr.write(render(docs))
    sys.stderr.flush()


def render(docs: list[dict[str, Any]]) -> str:
    """The summary as text: a rich table, or one line when no loader was made."""
    if not any(d["loaders"] for d in docs):
        return "unstall run: the program made no DataLoader, so there is no stall to report\n"
    from rich.console import Console
    from rich.table import Table

    table = Table(title="unstall run: where the training loop waited for data")
    for column in ("process", "loader", "batches", "waiting", "fetch/batch", "prep/batch", "rate"):
        table.add_column(column, justify="left" if column == "process" else "right")
    for doc in docs:
        who = f"rank {doc['rank']}" if doc["rank"] is not None else f"pid {doc['pid']}"
        for row in doc["loaders"]:
            table.add_row(
                who,
                f"#{row['loader']} {row['dataset']}",
                str(row["batches"]),
                f"{100 * row['wait_share']:.1f} % ({row['wait_s']:.2f} s)",
                _ms(row["fetch_ms_per_batch"]),
                _ms(row["prep_ms_per_batch"]),
                f"{row['samples_per_s']:,.0f}/s",
            )
    console = Console(file=None, stderr=True, record=True, width=110)
    with console.capture() as capture:
        console.print(table)
        console.print(
            "waiting: time in the loader's __next__ as a share of the loop's wall time; "
            "fetch/prep: a worker's time per batch (fetch shows '-' when the dataset does "
            "not separate fetching from preparing: prep then holds both)"
        )
    return capture.get()


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value and value.isdigit() else None
