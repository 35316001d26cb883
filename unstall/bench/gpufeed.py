"""`bench gpufeed`: the training loop's thread and the GPU stage's, per batch, with DALI fed.

Runs without a GPU: ``prep="gpu"``, ``"hybrid"`` and ``"auto"`` on ``device="cpu"``, so the
GPU stage's engine is DALI's CPU backend, at batch 256 (the GPU goal's batch), with the
same workers, seed and warm local JPEGs per case. Nothing trains: the loop only takes
batches, so every CPU second of the training process per batch is the loader's. Per case:

- ``main_cpu_ms_per_batch``: the CPU of the thread calling ``__next__`` (the training
  loop's; the goal: <= 3 ms), from ``loader.stats()`` before and after the timed batches;
- ``stage_cpu_ms_per_batch``: the GPU stage's own thread (feeding DALI, taking its
  output, splitting a hybrid batch), which holds the GIL for its Python parts;
- ``dali_feed_cpu_ms_per_batch``: of that, handing DALI the batch.

A first case, host batches from the CPU workers with no GPU stage, is the loop thread's
reference. Each prep runs with the feed unstall uses (``tensors``: the bytes in place, one DALI
tensor per sample made in C++, two ``feed_input`` calls) and with the one it replaced,
measured in the same run (``arrays``: one numpy array per sample through DALI's
Python checks; ``UNSTALL_DALI_FEED=arrays``). Headline ratio: the feed's CPU per batch
with ``arrays`` over ``tensors`` for ``prep="gpu"`` (each row: its prep's). On the CPU backend
the stage's thread also copies DALI's output (a memcpy; an asynchronous device copy
on a GPU): the output is kept small (64 px) so that copy does not hide the feed.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from typing import Any

from unstall import machine
from unstall.bench.harness import BenchResult, Measurement, row
from unstall.data import ImageFolder
from unstall.loader import DataLoader
from unstall.pipeline import ImagePipeline
from unstall.stores import LocalStore

DESCRIPTION = "the loop thread's and the GPU stage's CPU per batch with DALI's CPU backend"
BATCH, IMAGE_SIZE, WORKERS = 256, 64, 2
GOAL_MAIN_CPU_MS = 3.0
PREPS = ("gpu", "hybrid", "auto")
FEED_ENV = machine.DALI_FEED_ENV  # `unstall.gpu.engine.FEED_ENV`: bench never imports gpu's names


def run(*, quick: bool, console: Any = None, repeats: int | None = None) -> BenchResult:
    """Each prep with each feed, ``repeats`` times (medians), at batch 256 on DALI's CPU backend."""
    from unstall.data.synthetic import ensure_demo_dataset

    say = console.print if console is not None else (lambda *a: None)
    warmup, timed = (2, 3) if quick else (2, 6)
    repeats = repeats or (1 if quick else 3)
    images = BATCH * (warmup + timed)
    say(
        f"bench gpufeed: batch {BATCH}, {IMAGE_SIZE} px, {WORKERS} workers, DALI's CPU backend; "
        f"{warmup} warm-up + {timed} timed batches per case; {repeats} run(s), medians"
    )
    root = os.fspath(ensure_demo_dataset(images=images, classes=10, seed=0, progress=False))
    store = LocalStore(root)
    warm = ImageFolder(store, raw=True)
    for i in range(0, len(warm), 256):  # page cache warm
        warm.fetch(range(i, min(i + 256, len(warm))))
    cases = [("cpu", "-")] + [(prep, feed) for prep in PREPS for feed in ("tensors", "arrays")]
    cases = [c for c in cases if c[0] != "auto" or c[1] == "tensors"]
    per_run: dict[str, list[dict[str, Any]]] = {f"{p}/{f}": [] for p, f in cases}
    for _ in range(repeats):
        for prep, feed in cases:
            per_run[f"{prep}/{feed}"].append(one_case(store, prep, feed, warmup, timed))
    figures = {name: _median(runs) for name, runs in per_run.items()}
    for name, f in figures.items():
        say(
            f"  {name:14s} loop thread {f['main_cpu_ms_per_batch']:6.2f} ms/batch, GPU stage "
            f"thread {f['stage_cpu_ms_per_batch']:6.2f} (DALI feed "
            f"{f['dali_feed_cpu_ms_per_batch']:5.2f}, output copy "
            f"{f['dali_copy_cpu_ms_per_batch']:5.2f}), {f['samples_per_s']:7.1f} samples/s"
        )
    return _result(figures, per_run, warmup, timed, repeats)


def one_case(store: LocalStore, prep: str, feed: str, warmup: int, timed: int) -> dict[str, Any]:
    """One loader, ``warmup`` batches, stats reset, ``timed`` batches: its figures."""
    with machine.environment({FEED_ENV: feed}):
        host = prep == "cpu"  # the reference: lean host batches, no device stage
        pipeline = ImagePipeline(IMAGE_SIZE, output="uint8" if host else "float")
        loader = DataLoader(
            ImageFolder(store, transform=pipeline), batch_size=BATCH, num_workers=WORKERS,
            shuffle=True, seed=0, drop_last=True, device=None if host else "cpu",
            prep=None if host else prep,
        )  # fmt: skip
        batches = iter(loader)
        for _ in range(warmup):
            next(batches)
        first = loader.stats()  # cumulative figures: the timed batches are the difference
        start, cpu0 = time.perf_counter(), time.process_time()
        samples = sum(len(next(batches)[1]) for _ in range(timed))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
        stats = loader.stats()
        del batches
        loader.close()
        del loader
        gc.collect()
    plan = stats.get("prep_plan", {})

    def per_batch(key: str) -> float:  # [Unit: ms] over the timed batches
        return round(1e3 * (stats.get(key, 0.0) - first.get(key, 0.0)) / timed, 4)

    def engine_ms(key: str) -> float:  # the engine's averages cover every batch so far
        before = first.get("prep_plan", {}).get(key, 0.0) * warmup
        return round((plan.get(key, 0.0) * (warmup + timed) - before) / timed, 4)

    return {
        "samples": samples,
        "wall_s": round(wall, 4),
        "samples_per_s": round(samples / wall, 2),
        "main_cpu_ms_per_batch": per_batch("main_cpu_s"),
        "stage_cpu_ms_per_batch": per_batch("stage_cpu_s"),
        "process_cpu_ms_per_batch": round(1e3 * cpu / timed, 3),
        "dali_feed_cpu_ms_per_batch": engine_ms("dali_feed_cpu_ms_per_batch"),
        "dali_copy_cpu_ms_per_batch": engine_ms("dali_copy_cpu_ms_per_batch"),
        "dali_feed": plan.get("dali_feed"),
        "engine": plan.get("engine"),
        "mode": plan.get("mode"),
        "cpu_share": plan.get("cpu_share"),
    }


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float):
            out[key] = round(statistics.median(r[key] for r in runs), 4)
    return out


def _result(
    figures: dict[str, dict[str, Any]],
    per_run: dict[str, list[dict[str, Any]]],
    warmup: int,
    timed: int,
    repeats: int,
) -> BenchResult:
    now, before = figures["gpu/tensors"], figures["gpu/arrays"]
    ratio = before["dali_feed_cpu_ms_per_batch"] / max(now["dali_feed_cpu_ms_per_batch"], 1e-9)
    rows = []
    for name, f in figures.items():
        m = Measurement(f["samples"], f["wall_s"], 0.0, f["wall_s"], timed)
        base = figures.get(name.replace("tensors", "arrays"))
        feed_ratio = None
        if name.endswith("tensors") and base is not None:
            feed_ratio = base["dali_feed_cpu_ms_per_batch"] / max(
                f["dali_feed_cpu_ms_per_batch"], 1e-9
            )
        what = f"prep={name.split('/')[0]!r}, DALI fed {name.split('/')[1]}"
        if name.startswith("cpu"):
            what = "CPU workers, host batches (the loop thread's reference)"
        rows.append(
            row(
                name,
                what,
                m,
                feed_ratio,
                loop_ms=f["main_cpu_ms_per_batch"],
                stage_ms=f["stage_cpu_ms_per_batch"],
                feed_ms=f["dali_feed_cpu_ms_per_batch"],
                copy_ms=f["dali_copy_cpu_ms_per_batch"],
            )
        )
    worst = max(f["main_cpu_ms_per_batch"] for name, f in figures.items() if "tensors" in name)
    reference = figures["cpu/-"]["main_cpu_ms_per_batch"]
    return BenchResult(
        name="gpufeed",
        ratio=ratio,
        baseline={"variant": "gpu/arrays", **before},
        unstall={"variant": "gpu/tensors", **now},
        rows=rows,
        detail={
            "variants": figures,
            "per_run": per_run,
            "goal": {"main_cpu_ms_per_batch": GOAL_MAIN_CPU_MS},
            "goal_met": worst <= GOAL_MAIN_CPU_MS,
            "config": {
                "batch_size": BATCH,
                "image_size": IMAGE_SIZE,
                "workers": WORKERS,
                "warmup_batches": warmup,
                "timed_batches": timed,
                "repeats": repeats,
            },
        },
        notes=[
            "DALI's CPU backend (no GPU): the plumbing of the GPU stage at the GPU goal's batch",
            "loop = the thread calling __next__ (goal <= 3 ms per batch for every prep); "
            "stage = the GPU stage's thread (holds the GIL for its Python parts)",
            "ratio: the CPU per batch of feeding DALI, as numpy arrays (before) over as DALI "
            "tensors (now), same prep; headline: prep='gpu'",
            f"worst loop thread with the tensors feed: {worst:.2f} ms per batch; with host "
            f"batches from the CPU workers (no GPU stage): {reference:.2f} ms",
            "on DALI's CPU backend the stage thread also copies each output out (a memcpy, "
            "'copy ms'); on a GPU that is an asynchronous device copy",
        ],
    )
