"""`bench overhead`: the loader's own machinery as the bottleneck.

Tiny in-memory items, a consumer that does nothing, the same num_workers and
batch size for both loaders: what remains is per-batch scheduling, IPC and
collation. unstall must not tax users whose training does not stall (goal:
ratio >= 0.97, median of 3 alternating pairs).
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from unstall.bench.harness import BenchResult, Measurement, measure, row
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
    torch_runs: list[Measurement] = []
    unstall_runs: list[Measurement] = []
    ratios = []
    for i in range(repeats):
        # alternate which goes first, so drift on a noisy machine hits both alike
        pair = (torch_run, unstall_run) if i % 2 == 0 else (unstall_run, torch_run)
        results = {fn: fn() for fn in pair}
        torch_runs.append(results[torch_run])
        unstall_runs.append(results[unstall_run])
        ratios.append(results[unstall_run].samples_per_s / results[torch_run].samples_per_s)
        if console is not None:
            console.print(
                f"  pair {i + 1}/{repeats}: torch {torch_runs[-1].samples_per_s:,.0f}/s, "
                f"unstall {unstall_runs[-1].samples_per_s:,.0f}/s, ratio {ratios[-1]:.3f}"
            )
    ratio = statistics.median(ratios)
    t_med = statistics.median(m.samples_per_s for m in torch_runs)
    u_med = statistics.median(m.samples_per_s for m in unstall_runs)
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
