"""`bench overhead`: the loader's own machinery as the bottleneck.

Tiny in-memory items, a consumer that does nothing, the same num_workers and
batch size for both loaders: what remains is per-batch scheduling, IPC and
collation. unstall must not tax users whose training does not stall (goal:
ratio >= 0.97, median of 3 alternating pairs).
"""

from __future__ import annotations

from typing import Any

import torch

from unstall.bench.harness import BenchResult, Measurement, measure, row, run_pairs
from unstall.loader import DataLoader

DESCRIPTION = "loader machinery only: tiny in-memory items, no compute (goal >= 0.97x torch)"


class TinyItems(torch.utils.data.Dataset):
    """Item i is the int i: as cheap as an item can be."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        return index


def run(
    *, quick: bool, console: Any = None, repeats: int = 3, items: int | None = None
) -> BenchResult:
    n = items or (400_000 if quick else 1_500_000)
    batch_size, workers = 64, 2
    dataset = TinyItems(n)

    def torch_run() -> Measurement:
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=batch_size, shuffle=True, num_workers=workers
        )
        return measure(loader)

    def unstall_run() -> Measurement:
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers)
        return measure(loader)

    torch_run(), unstall_run()  # warm-up: imports, allocator, page faults

    def said(i: int, t: Measurement, u: Measurement) -> None:
        if console is not None:
            console.print(
                f"  pair {i + 1}/{repeats}: torch {t.samples_per_s:,.0f}/s, "
                f"unstall {u.samples_per_s:,.0f}/s, ratio {u.samples_per_s / t.samples_per_s:.3f}"
            )

    # alternate which goes first, so drift on a noisy machine hits both alike
    runs = run_pairs(torch_run, unstall_run, repeats, rate=_rate, on_pair=said)
    torch_runs, unstall_runs, ratios = runs.base, runs.new, runs.rates.ratios
    ratio, t_med, u_med = runs.rates.ratio, runs.rates.base_median, runs.rates.new_median
    rows = []
    for i, (t, u) in enumerate(zip(torch_runs, unstall_runs, strict=True)):
        rows.append(row(f"run {i + 1}", "torch", t))
        rows.append(row(f"run {i + 1}", "unstall", u, ratios[i]))
    return BenchResult(
        name="overhead",
        ratio=ratio,
        baseline={"loader": "torch.utils.data.DataLoader", "samples_per_s": round(t_med, 1)},
        unstall={"loader": "unstall.DataLoader", "samples_per_s": round(u_med, 1)},
        rows=rows,
        detail={
            "ratios": [round(r, 4) for r in ratios],
            "goal": 0.97,
            "config": {"items": n, "batch_size": batch_size, "num_workers": workers},
        },
        notes=[f"median of {repeats} alternating pairs; goal: ratio >= 0.97"],
    )


def _rate(m: Measurement) -> float:
    return m.samples_per_s
