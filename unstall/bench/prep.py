"""`bench prep`: image preparation as the bottleneck, torch's float32 pipeline vs unstall lean.

Both loaders read the same warm local JPEGs with the same workers and batch
size, and nothing consumes the batches but the loop itself, so throughput is
what the workers prepare and the main process receives. The baseline is what a
typical torch user runs: PIL decode, RandomResizedCrop, flip, ToTensor and
Normalize per image in float32 (`TorchReferencePipeline`), batches through
torch's shared-memory hand-off. unstall lean: the same augmentation on uint8
(`ImagePipeline(output="uint8")`, DCT-scaled decode), batches through zero-copy
slots. The float conversion and normalization of a lean batch belong to the
accelerator (`NormalizeImages` on the device: one fused pass over a batch in
GPU memory, microseconds), so they are not run on this CPU-only machine's main
process; the "cpu-normalize" row shows what they would cost if they were.
"""

from __future__ import annotations

import os
import resource
import statistics
from collections.abc import Callable
from typing import Any

import torch

from unstall import machine
from unstall.bench.harness import BenchResult, Measurement, measure, row, run_pairs
from unstall.bench.local import PerSample
from unstall.data import ImageFolder
from unstall.loader import DataLoader
from unstall.loader.device import NormalizeImages
from unstall.pipeline import ImagePipeline, TorchReferencePipeline
from unstall.stores import LocalStore

DESCRIPTION = "prep-bound: torch + float32 PIL pipeline vs unstall lean uint8 + zero-copy slots"


def main_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process's threads, not its workers."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def timed(make: Callable[[], Any]) -> tuple[Measurement, float, float]:
    """One epoch of a fresh loader: the measurement, and the main process's CPU time.

    Returns ``(measurement, steady, startup)``: ``steady`` is CPU seconds per 1,000
    samples after the first batch arrived (what every later batch of a long epoch
    costs), ``startup`` the CPU seconds until then (loader, workers, first batch),
    which a real epoch of thousands of batches pays once.
    """
    loader = make()
    marks: list[tuple[float, int]] = []

    def on_batch(n: int) -> None:
        if not marks:
            marks.append((main_cpu_s(), n))

    before = main_cpu_s()
    m = measure(loader, on_batch=on_batch)
    end = main_cpu_s()
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    first_cpu, first_n = marks[0] if marks else (end, 0)
    steady = 1000 * (end - first_cpu) / max(m.samples - first_n, 1)
    return m, steady, first_cpu - before


def run(
    *,
    quick: bool,
    console: Any = None,
    repeats: int = 5,
    images: int | None = None,
    batch_size: int = 64,
) -> BenchResult:
    from unstall.data.synthetic import ensure_demo_dataset

    images = images or (640 if quick else 2560)
    workers = min(2, machine.cores_available())
    root = os.fspath(ensure_demo_dataset(images=images, classes=10, seed=0, progress=False))
    store = LocalStore(root)
    torch_ds = ImageFolder(store, transform=TorchReferencePipeline())
    lean_ds = ImageFolder(store, transform=ImagePipeline(output="uint8"))
    for i in range(len(lean_ds)):  # warm the page cache: preparation, not storage, is measured
        lean_ds.fetch([i])
    loaders: dict[str, Callable[[], Any]] = {
        "torch": lambda: torch.utils.data.DataLoader(
            PerSample(torch_ds), batch_size=batch_size, shuffle=True, num_workers=workers
        ),
        "unstall": lambda: DataLoader(
            lean_ds, batch_size=batch_size, shuffle=True, num_workers=workers
        ),
    }
    extra: dict[str, Callable[[], Any]] = {
        "unstall cpu-normalize": lambda: DataLoader(
            lean_ds,
            batch_size=batch_size,
            shuffle=True,
            num_workers=workers,
            device="cpu",
            device_transform=NormalizeImages(),
        ),
        "torch + uint8 pipeline": lambda: torch.utils.data.DataLoader(
            PerSample(lean_ds), batch_size=batch_size, shuffle=True, num_workers=workers
        ),
    }
    if torch.cuda.is_available():
        gpu_ds = ImageFolder(store, transform=ImagePipeline())
        extra["unstall gpu-prep"] = lambda: DataLoader(
            gpu_ds, batch_size=batch_size, shuffle=True, num_workers=workers, device="cuda"
        )
    timed(loaders["torch"]), timed(loaders["unstall"])  # warm-up: imports, allocator

    def said(i: int, t: tuple[Measurement, float, float], u: tuple[Measurement, float, float]):
        if console is not None:
            console.print(
                f"  pair {i + 1}/{repeats}: torch {t[0].samples_per_s:,.0f}/s "
                f"({t[1]:.2f} CPU s/1k), unstall {u[0].samples_per_s:,.0f}/s "
                f"({u[1]:.2f} CPU s/1k), ratio {u[0].samples_per_s / t[0].samples_per_s:.3f}"
            )

    pairs = run_pairs(
        lambda: timed(loaders["torch"]),
        lambda: timed(loaders["unstall"]),
        repeats,
        rate=lambda run: run[0].samples_per_s,
        on_pair=said,
    )
    runs: dict[str, list[tuple[Measurement, float, float]]] = {
        "torch": pairs.base,
        "unstall": pairs.new,
        **{k: [] for k in extra},
    }
    ratios = pairs.rates.ratios
    for name, make in extra.items():
        runs[name].append(timed(make))
    summary = {name: _summary(rs) for name, rs in runs.items()}
    ratio = statistics.median(ratios)
    cpu_ratio = summary["unstall"]["main_cpu_s_per_1k"] / summary["torch"]["main_cpu_s_per_1k"]
    rows = []
    for name, rs in runs.items():
        m = sorted(rs, key=lambda r: r[0].samples_per_s)[len(rs) // 2][0]
        startup = summary[name]["startup_cpu_s"]
        rows.append(
            row(
                f"{len(rs)} run(s)",
                name,
                m,
                None
                if name == "torch"
                else summary[name]["samples_per_s"] / summary["torch"]["samples_per_s"],
                main_cpu_s_per_1k=summary[name]["main_cpu_s_per_1k"],
                startup_cpu_s=startup,
            )
        )
    return BenchResult(
        name="prep",
        ratio=ratio,
        baseline={
            "loader": "torch.utils.data.DataLoader + TorchReferencePipeline (float32)",
            **summary["torch"],
        },
        unstall={
            "loader": 'unstall.DataLoader + ImagePipeline(output="uint8"), zero-copy slots',
            **summary["unstall"],
        },
        rows=rows,
        detail={
            "ratios": [round(r, 4) for r in ratios],
            "main_cpu_ratio": round(cpu_ratio, 4),
            "others": {k: v for k, v in summary.items() if k not in loaders},
            "goal": {"ratio": 1.3, "main_cpu_ratio": round(1 / 3, 4)},
            "config": {"images": images, "batch_size": batch_size, "num_workers": workers},
        },
        notes=[
            f"median of {repeats} alternating pairs; goal: ratio >= 1.3 and main-process CPU "
            f"per sample <= 1/3 of torch's (here {cpu_ratio:.3f})",
            "main_cpu_s_per_1k: CPU seconds of the training process (not its workers) per "
            "1,000 samples once batches flow; lean batches are normalized on the accelerator, "
            "so not here",
            f"start-up CPU (loader, workers, first batch), paid once per epoch: torch "
            f"{summary['torch']['startup_cpu_s']:.3f} s, unstall "
            f"{summary['unstall']['startup_cpu_s']:.3f} s",
        ],
    )


def _summary(runs: list[tuple[Measurement, float, float]]) -> dict[str, float]:
    return {
        "samples_per_s": round(statistics.median(m.samples_per_s for m, _, _ in runs), 1),
        "main_cpu_s_per_1k": round(statistics.median(c for _, c, _ in runs), 4),
        "startup_cpu_s": round(statistics.median(s for _, _, s in runs), 4),
        "stall_fraction": round(statistics.median(m.stall_fraction for m, _, _ in runs), 4),
    }
