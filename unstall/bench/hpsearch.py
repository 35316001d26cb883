"""`bench hpsearch`: K jobs of a sweep on one node, independent vs coordinated loaders.

K job processes train (a simulated model at the same rate) on the same JPEGs,
side by side, in three variants per repeat: K independent torch DataLoaders
(the lean uint8 pipeline per sample, torch's hand-off), K independent unstall
loaders, K unstall loaders in one ``coordinate=`` group (each batch prepared once).
Prep-bound on this machine: the model rate is far above what its cores prepare.
Each job reports samples, its wall time and its CPU (its own + its workers') from its
first batch to its last: the steady state of a sweep that runs for hours (process and
worker start-up, paid once per run, would dominate a run of seconds).
A second case runs one job at half the others' rate, long enough for it to fall a window
behind and be detached: the others must keep their pace (the rate leaves the cores room
for the group's batches and the detached job's own).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from unstall.bench.harness import BenchResult

DESCRIPTION = "K=4 sweep jobs: independent torch / unstall loaders vs one coordinated group"
VARIANTS = ("torch", "unstall", "coordinated")
#: The slow case's job rate, as a fraction of a coordinated job's rate (what the cores prepare).
SLOW_CASE_LOAD = 0.5


def _tree_cpu_s() -> float:
    """CPU seconds of this job, its finished worker processes and its live ones."""
    import resource

    import psutil

    me = psutil.Process()
    gone = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers of past epochs (reaped)
    total = sum(me.cpu_times()[:2]) + gone.ru_utime + gone.ru_stime
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


def job(
    variant: str,
    root: str,
    batch_size: int,
    rate: float,
    barrier: str,
    k: int,
    group: str,
    epochs: int = 1,
) -> None:
    """One sweep job (run in its own process): ``epochs`` epochs fed to the simulated model."""
    import torch

    from unstall.bench.local import PerSample
    from unstall.data import ImageFolder
    from unstall.loader import DataLoader
    from unstall.models.simulated import SimulatedAccelerator
    from unstall.pipeline import ImagePipeline
    from unstall.stores import LocalStore

    ds = ImageFolder(LocalStore(root), transform=ImagePipeline(output="uint8"))
    if variant == "torch":
        loader: Any = torch.utils.data.DataLoader(
            PerSample(ds), batch_size=batch_size, shuffle=True, num_workers=1
        )
    else:
        extra = {"coordinate": group} if variant == "coordinated" else {}
        loader = DataLoader(ds, batch_size=batch_size, shuffle=True, seed=0, num_workers=1, **extra)
    open(os.path.join(barrier, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(barrier)) < k and time.monotonic() < deadline:
        time.sleep(0.002)
    accel = SimulatedAccelerator(rate)
    it = iter(loader)
    accel.step(next(it))  # steady state from the first batch on: start-up is paid once a run
    c0, t0, n0 = _tree_cpu_s(), time.perf_counter(), accel.samples
    for epoch in range(epochs):
        if epoch > 0:
            it = iter(loader)
        for _ in range(len(loader) - (epoch == 0)):
            accel.step(next(it))
        if epoch < epochs - 1:
            for _ in it:  # the epoch's end: its workers exit
                pass
    elapsed = time.perf_counter() - t0
    cpu = _tree_cpu_s() - c0  # before the last epoch's workers exit
    out = {"samples": accel.samples - n0, "elapsed_s": elapsed, "cpu_s": cpu}
    for _ in it:
        pass
    if variant == "coordinated":
        out["coordination"] = loader.stats()["coordination"]
        loader.close()
    del loader
    print(json.dumps(out))


def _sweep(
    variant: str, rates: list[float], root: str, batch_size: int, epochs: int = 1
) -> list[dict[str, Any]]:
    """K jobs at ``rates`` started together; their reports."""
    with tempfile.TemporaryDirectory() as barrier:
        group = f"bench-hp-{os.getpid()}-{time.monotonic_ns()}"
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "unstall.bench.hpsearch",
                    variant,
                    root,
                    str(batch_size),
                    str(r),
                    barrier,
                    str(len(rates)),
                    group,
                    str(epochs),
                ],
                stdout=subprocess.PIPE,
                text=True,
            )
            for r in rates
        ]
        outs = []
        for p in procs:
            stdout, _ = p.communicate(timeout=600)
            if p.returncode != 0:
                raise RuntimeError(f"{variant} job exited with {p.returncode}")
            outs.append(json.loads(stdout.strip().splitlines()[-1]))
    return outs


def _aggregate(outs: list[dict[str, Any]]) -> dict[str, float]:
    samples = sum(o["samples"] for o in outs)
    wall = max(o["elapsed_s"] for o in outs)
    return {
        "aggregate_samples_per_s": samples / wall,
        "cpu_s_per_sample": sum(o["cpu_s"] for o in outs) / samples,
        "per_job_samples_per_s": [o["samples"] / o["elapsed_s"] for o in outs],
    }


def run(*, quick: bool, console: Any = None, k: int = 4, repeats: int | None = None) -> BenchResult:
    from unstall.data.synthetic import ensure_demo_dataset

    images = 1280 if quick else 5120
    repeats = repeats or (3 if quick else 5)
    batch_size, rate = 32, 4000.0  # ResNet-50 on an H100: far above this machine's prep
    root = os.fspath(ensure_demo_dataset(images=images, classes=10, seed=0, progress=False))
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for i in range(repeats):
        for v in VARIANTS if i % 2 == 0 else reversed(VARIANTS):
            runs[v].append(_aggregate(_sweep(v, [rate] * k, root, batch_size)))
            if console is not None:
                a = runs[v][-1]
                console.print(
                    f"  repeat {i + 1}/{repeats} {v}: "
                    f"{a['aggregate_samples_per_s']:,.0f} samples/s, "
                    f"{1e3 * a['cpu_s_per_sample']:.2f} CPU ms/sample"
                )
    med = {
        v: {
            key: round(statistics.median(r[key] for r in rs), 6)
            for key in ("aggregate_samples_per_s", "cpu_s_per_sample")
        }
        for v, rs in runs.items()
    }
    ratio = med["coordinated"]["aggregate_samples_per_s"] / med["torch"]["aggregate_samples_per_s"]
    gain = med["coordinated"]["aggregate_samples_per_s"] / med["unstall"]["aggregate_samples_per_s"]
    cpu_ratio = med["coordinated"]["cpu_s_per_sample"] / med["unstall"]["cpu_s_per_sample"]
    # Second case: the others' pace with one job at half their rate, vs all at the same rate.
    per_job = statistics.median(
        statistics.median(r["per_job_samples_per_s"]) for r in runs["coordinated"]
    )
    # A job left behind is detached and then prepares its own batches: the cores must have
    # room for the group's batches and its own (r + r/2 = 0.75 of what they prepare), else
    # the others slow down for want of CPU, not because they wait (0.8 of it: 82 %, full run).
    r2 = SLOW_CASE_LOAD * per_job
    # long enough for the slow job to fall a window behind and be detached (default W, T)
    epochs = max(1, -(-160 * batch_size // images))
    same, slow = [], []
    for _ in range(repeats):
        same_outs = _sweep("coordinated", [r2] * k, root, batch_size, epochs)
        same.append(statistics.median(_aggregate(same_outs)["per_job_samples_per_s"][1:]))
        slow_outs = _sweep("coordinated", [r2 / 2] + [r2] * (k - 1), root, batch_size, epochs)
        slow.append(statistics.median(_aggregate(slow_outs)["per_job_samples_per_s"][1:]))
    keep = statistics.median(slow) / statistics.median(same)
    slow_case = {
        "rate_samples_per_s": round(r2, 1),
        "epochs": epochs,
        "slow_job_rate": round(r2 / 2, 1),
        "others_samples_per_s_all_same": round(statistics.median(same), 1),
        "others_samples_per_s_one_slow": round(statistics.median(slow), 1),
        "others_keep": round(keep, 4),
        "slow_job_coordination": slow_outs[0].get("coordination"),
    }
    rows = [
        {
            "case": f"K={k}",
            "loader": v,
            "samples_per_s": med[v]["aggregate_samples_per_s"],
            "cpu_ms_per_sample": round(1e3 * med[v]["cpu_s_per_sample"], 4),
        }
        for v in VARIANTS
    ]
    return BenchResult(
        name="hpsearch",
        ratio=ratio,
        baseline={"loader": f"{k} independent torch DataLoaders (uint8 pipeline)", **med["torch"]},
        unstall={"loader": f"{k} unstall loaders, coordinate=group", **med["coordinated"]},
        rows=rows,
        detail={
            "variants": med,
            "coordination_gain": round(gain, 4),
            "cpu_per_sample_ratio": round(cpu_ratio, 4),
            "one_job_at_half_rate": slow_case,
            "goal": {
                "coordination_gain": 3.5,
                "cpu_per_sample_ratio": round(1 / k, 4),
                "others_keep": 0.9,
            },
            "config": {
                "k": k,
                "images": images,
                "batch_size": batch_size,
                "rate": rate,
                "num_workers_per_job": 1,
                "repeats": repeats,
            },
        },
        notes=[
            f"medians of {repeats} repeats (variants alternate order); aggregate = all jobs' "
            "samples / the sweep's wall time; CPU = jobs' own + their workers'",
            f"coordination_gain {gain:.2f} (goal >= 3.5), CPU per sample "
            f"{cpu_ratio:.3f} of independent unstall loaders (ideal {1 / k:.3f})",
            f"one job at half rate: the others keep {keep:.1%} of their pace (goal >= 90 %)",
        ],
    )


if __name__ == "__main__":
    a = sys.argv[1:]
    job(a[0], a[1], int(a[2]), float(a[3]), a[4], int(a[5]), a[6], int(a[7]))
