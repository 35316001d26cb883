"""Each loader's stall figures at exit: written per process, summarised by the first.

Every process of an ``unstall run`` that made a loader writes
``$UNSTALL_RUN_DIR/<pid>.json`` (the folder is made by the first such process, so
a run with no Python in it leaves nothing behind); the run's first process (the
one `unstall run` became) prints one table over all of them at its exit and,
with ``--json``, writes them to a file. Under DDP each rank is a row named by its
rank; loaders a framework made and replaced before taking a batch from them
(Lightning's distributed re-creation, accelerate's `DataLoaderShard`) are folded
into one line instead of rows of zeros.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import textwrap
import time
import weakref
from pathlib import Path
from typing import Any

from unstall import machine

_START = time.time()
#: How long the first process waits at exit for other processes still writing theirs.
WAIT_FOR_OTHERS_S = 15.0


class _Watcher:
    """A `hooks.Observer` keeping each loader's latest stats (kept after the loader is gone)."""

    def __init__(self) -> None:
        self.records: dict[int, dict[str, Any]] = {}  # loader number -> its summary
        self.live: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.rank: int | None = None  # the rank, torch.distributed's once it has one

    def created(self, loader: Any) -> None:
        if not self.records:
            _announce()
        number = len(self.records)
        self.live[loader] = number
        self.records[number] = describe(loader, number)
        self.rank = machine.rank_if_any(self.rank)

    def batch(self, loader: Any, wait_s: float, samples: int | None = None) -> None:
        pass

    def finished(self, loader: Any) -> None:
        number = self.live.get(loader)
        if number is not None:
            self.records[number] = describe(loader, number)
        self.rank = machine.rank_if_any(self.rank)

    def refresh(self) -> list[dict[str, Any]]:
        for loader, number in list(self.live.items()):
            self.records[number] = describe(loader, number)
        return [self.records[n] for n in sorted(self.records)]


_watcher: _Watcher | None = None


def watch() -> None:
    """Start recording every unstall loader this process makes."""
    global _watcher
    if _watcher is None:
        from unstall.loader import hooks

        _watcher = _Watcher()
        hooks.add_observer(_watcher)


def describe(loader: Any, number: int) -> dict[str, Any]:
    """One loader's figures: batches (per epoch), stall share, fetch and prepare per batch,
    throughput. Samples are counted from the batches (right with a ``batch_sampler``)."""
    s = loader.stats()
    batches = s["batches"]
    # A dataset that does not separate fetching from preparing records fetch as 0: unknown.
    fetch_ms = s["fetch"].get("mean_ms") if s["fetch"].get("total_s") else None
    prep_ms = s["prep"].get("mean_ms", 0.0) if s["prep"]["count"] else None
    return {
        "loader": number,
        "dataset": type(loader.dataset).__name__,
        "loader_class": type(loader).__name__,
        "batch_size": loader.batch_size,
        "num_workers": loader.num_workers,
        "batches": batches,
        "samples": s["samples"],
        "epochs_completed": s["epochs_completed"],
        "batches_per_epoch": [e.get("batches", 0) for e in s["per_epoch"]],
        "wall_s": s["wall_s"],
        "wait_s": s["wait_s"],
        "wait_share": s["stall_fraction"],
        "wait_ms_per_batch": round(1e3 * s["wait_s"] / batches, 3) if batches else 0.0,
        "fetch_ms_per_batch": fetch_ms,
        "prep_ms_per_batch": prep_ms,
        "samples_per_s": s["samples_per_s"],
        "main_cpu_ms_per_batch": s.get("main_cpu_ms_per_batch"),
        **({"cache": cache_row(s["cache"])} if isinstance(s.get("cache"), dict) else {}),
        **({"remote": s["remote"]} if isinstance(s.get("remote"), dict) else {}),  # issue 45
        "_dataset_id": id(loader.dataset),
    }


def _remote_line(row: dict[str, Any]) -> str:
    """What a loader's remote workers (``remote=``, issue 45) did, in one line."""
    r = row["remote"]
    return (
        f"loader #{row['loader']}: {r['batches']} of {r['batches'] + r['local_batches']} batches "
        f"prepared by {r['workers']} remote workers on {len(r['nodes'])} nodes "
        f"({r['bytes'] / 2**20:,.1f} MiB moved, {r['resent']} re-sent)"
    )


def cache_row(c: dict[str, Any]) -> dict[str, Any]:
    """The loader's cache in one row: whole files (a dataset that opens its own, issue 40)
    or the dataset's samples; its hit rate and what it holds."""
    return {
        "level": c.get("level", "sample"),
        "hit_rate": c.get("hit_rate"),
        "hits": c.get("hits"),
        "misses": c.get("misses"),
        "items_cached": c.get("items_cached"),
        "capacity_bytes": c.get("capacity_bytes"),
    }


def fold(records: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(used, folded)``: loaders that handed out no batch are folded, as ``replaced``
    when a later loader took over their dataset (a framework's re-creation), else
    ``unused``."""
    used, folded = [], []
    for i, rec in enumerate(records):
        row = {k: v for k, v in rec.items() if k != "_dataset_id"}
        if rec["batches"]:
            used.append(row)
            continue
        later = any(r["_dataset_id"] == rec["_dataset_id"] for r in records[i + 1 :])
        folded.append(
            {
                "loader": rec["loader"],
                "dataset": rec["dataset"],
                "why": "replaced" if later else "unused",
            }
        )
    return used, folded


def _run_dir() -> Path | None:
    run_dir = machine.run_dir()
    return Path(run_dir) if run_dir else None


def _root_alive() -> bool:
    """Whether the run's first process (which reads the reports) is still running."""
    root = machine.run_root()
    if root is None or root == os.getpid():
        return True
    try:
        os.kill(root, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _announce() -> None:
    """Mark this process as one that will write a report (the first process waits for it)."""
    run_dir = _run_dir()
    if run_dir is None or not _root_alive():
        return
    with contextlib.suppress(OSError):
        run_dir.mkdir(mode=0o700, exist_ok=True)
        (run_dir / f"{os.getpid()}.live").touch()


def write_own() -> None:
    """Write this process's loaders to ``$UNSTALL_RUN_DIR/<pid>.json`` (none made: nothing)."""
    run_dir = _run_dir()
    if _watcher is None or run_dir is None or not _watcher.records or not _root_alive():
        return
    from unstall.loader.iterate import end_open_epochs

    end_open_epochs()  # an iterator kept to the end: its epoch ends with the program
    used, folded = fold(_watcher.refresh())
    doc = {
        "pid": os.getpid(),
        "rank": machine.rank_if_any(_watcher.rank),
        "local_rank": machine.local_rank(),
        "argv": sys.argv,
        "process_wall_s": round(time.time() - _START, 3),
        "loaders": used,
        "folded": folded,
    }
    run_dir.mkdir(mode=0o700, exist_ok=True)
    path = run_dir / f"{os.getpid()}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    with contextlib.suppress(OSError):
        (run_dir / f"{os.getpid()}.live").unlink()


def collect(run_dir: str | Path, *, wait_s: float = 0.0) -> list[dict[str, Any]]:
    """Every process's report in ``run_dir``, ranks first in order, then by pid.

    With ``wait_s``, first waits (that long at most) for processes that made a
    loader and are still running to write theirs (e.g. DDP ranks a framework started).
    """
    run_dir = Path(run_dir)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _writers_pending(run_dir):
        time.sleep(0.05)
    docs = []
    for path in run_dir.glob("*.json"):
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(docs, key=lambda d: (d["rank"] is None, d["rank"] or 0, d["pid"]))


def _writers_pending(run_dir: Path) -> bool:
    for live in run_dir.glob("*.live"):
        pid = int(live.stem)
        if pid == os.getpid() or (run_dir / f"{pid}.json").exists():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue  # died without a report
        except PermissionError:
            pass
        return True
    return False


def print_summary() -> None:
    """At the run's end: one table of all processes' loaders (stderr), and ``--json``."""
    run_dir = _run_dir()
    if run_dir is None:
        return
    docs = collect(run_dir, wait_s=WAIT_FOR_OTHERS_S) if run_dir.exists() else []
    out_json = machine.run_json()
    if out_json:
        Path(out_json).write_text(json.dumps({"processes": docs}, indent=2))
    shutil.rmtree(run_dir, ignore_errors=True)
    sys.stderr.write(render(docs))
    sys.stderr.flush()


def render(docs: list[dict[str, Any]]) -> str:
    """The summary as text: a table (plain text: importing rich at every exit would cost
    the run more than the rest of the report), or one line when no loader handed out a batch."""
    folded = sum(len(d.get("folded", [])) for d in docs)
    if not any(d["loaders"] for d in docs):
        if folded:
            return (
                f"unstall run: the program made {folded} DataLoader(s) but took no batch "
                "from any, so there is no stall to report\n"
            )
        return "unstall run: the program made no DataLoader, so there is no stall to report\n"
    header = ("process", "loader", "epochs", "batches", "waiting", "fetch/batch", "prep/batch")
    rows = [(*header, "rate")]
    for doc in docs:
        who = f"rank {doc['rank']}" if doc["rank"] is not None else f"pid {doc['pid']}"
        for row in doc["loaders"]:
            rows.append(
                (
                    who,
                    f"#{row['loader']} {row['dataset']}",
                    _epochs(row),
                    str(row["batches"]),
                    f"{100 * row['wait_share']:.1f} % ({row['wait_s']:.2f} s)",
                    _ms(row["fetch_ms_per_batch"]),
                    _ms(row["prep_ms_per_batch"]),
                    f"{row['samples_per_s']:,.0f}/s",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    out = ["unstall run: where the training loop waited for data", line(rows[0])]
    out.append("  ".join("-" * w for w in widths))
    out.extend(line(r) for r in rows[1:])
    out.extend(
        textwrap.wrap(
            "waiting: time in the loader's __next__ as a share of the time its iterators ran "
            "(from iter() to the last batch); epochs: completed x batches each; fetch/prep: a "
            "worker's time per batch (fetch shows '-' when the dataset does not separate "
            "fetching from preparing: prep then holds both)",
            width=100,
        )
    )
    out.extend(_remote_line(row) for doc in docs for row in doc["loaders"] if "remote" in row)
    if folded:
        replaced = sum(1 for d in docs for f in d.get("folded", []) if f["why"] == "replaced")
        out.append(
            f"not shown: {folded} loader(s) that handed out no batch"
            + (f" ({replaced} replaced by a framework before use)" if replaced else "")
        )
    return "\n".join(out) + "\n"


def _epochs(row: dict[str, Any]) -> str:
    sizes = set(row.get("batches_per_epoch", []))
    done = row.get("epochs_completed", 0)
    return f"{done} x {sizes.pop()}" if len(sizes) == 1 else str(done)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"
