"""`bench cachepoints`: where to cache, measured on unchanged torchvision ImageFolder scripts.

Two rows, each the same script run as it is (or under another cache) and under
``unstall run --config`` with a cache point, in the same bench run, interleaved, 2
workers, the page cache warm (every file read once before), the model simulated by a
sleep per batch fast enough that the job is prep-bound:

- **validation**: ``Resize(256) + CenterCrop(224) + ToTensor + Normalize``, 3 passes;
  passes 2-3 under ``{"cache": {"size": ..., "hold": "samples"}}`` against the script as
  it is (goal >= 3x).
- **training**: ``RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize``,
  3 epochs, with a cache of half the decoded set: epochs 2-3 under ``hold="auto"`` (mixed
  placement) against the byte cache of the same size (goal >= 1.3x), and the same at a
  third and at a twelfth (never below the byte cache). Each row says the most any
  placement of decoded images could give at its share (`_bound`): a held sample skips its
  decode and nothing after it, so at a third of these images that ceiling is about 1.2x.

Each pair is measured ``repeats`` times (3 by default); the ratios are the medians of the
pairs'. Each side's CPU per sample (the script's and its workers' CPU seconds over passes
2-3) is given too: on a machine shared with other jobs it moves less than samples/s.
The validation images are the usual synthetic ~500x375 JPEGs (`unstall.data.synthetic`);
the training images are the same ones enlarged to 1024x768 (decoded 2.36 MB against a JPEG
of a few hundred KB): at 500x375 the decode is under half of a sample's CPU (2.8 ms of 6.6
ms measured here), so no placement of a third of the decoded set saves more than 14 % there.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from unstall.bench import harness
from unstall.bench.harness import BenchResult, read_all

DESCRIPTION = (
    "cache points on unchanged torchvision ImageFolder scripts: validation pass 2+ with the "
    "sample cache vs as is (goal >= 3x); RandomResizedCrop training with half the decoded "
    "set: mixed placement vs the byte cache of the same size (goal >= 1.3x; a third and a "
    "twelfth: never below it)"
)
GOAL_VALIDATION = 3.0
GOAL_MIXED = 1.3
#: The simulated model's step: 32 samples per 4 ms (8,000 samples/s), far above 2 workers.
STEP_MS = 4.0
IMAGES = {"quick": 384, "full": 1536}
#: Training images (1024x768) per run.
LARGE_IMAGES = {"quick": 96, "full": 384}
LARGE = (1024, 768)

SCRIPT = r"""
import json, multiprocessing, resource, sys, time
import torch, torchvision
from torch.utils.data import DataLoader
from torchvision import transforms as T

data, kind, passes, step_ms, out = sys.argv[1:6]
passes, step_ms = int(passes), float(step_ms)
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
if kind == "validation":
    tf = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
else:
    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize(MEAN, STD)])
dataset = torchvision.datasets.ImageFolder(data, transform=tf)
loader = DataLoader(dataset, batch_size=32, shuffle=kind != "validation", num_workers=2)
report = {"passes": [], "cache": None}


def cpu_s():  # this process's and its finished workers' (each pass's exit at its end)
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


for p in range(passes):
    n, t0, c0 = 0, time.perf_counter(), cpu_s()
    for images, target in loader:
        time.sleep(step_ms / 1000)
        n += len(target)
    wall = time.perf_counter() - t0
    deadline = time.monotonic() + 0.3
    while multiprocessing.active_children() and time.monotonic() < deadline:
        time.sleep(0.01)  # the pass's workers exit (reaped: their CPU counted)
    report["passes"].append({"samples": n, "wall_s": wall, "cpu_s": cpu_s() - c0})
stats = getattr(loader, "stats", None)
report["cache"] = stats().get("cache") if stats is not None else None
json.dump(report, open(out, "w"))
"""


def _run(work: Path, data: str, kind: str, cache: Any, passes: int, tag: str) -> dict[str, Any]:
    """One run of the script (as it is when ``cache`` is None): rates of passes 2 on."""
    script = work / "script.py"
    script.write_text(SCRIPT)
    out = work / f"out-{tag}.json"
    command = [sys.executable, str(script), data, kind, str(passes), str(STEP_MS), str(out)]
    if cache is not None:
        config = work / f"c-{tag}.json"
        config.write_text(json.dumps({"kwargs": {"cache": cache}}))
        command = harness.under_unstall(config, command)
    # each run fills its own cache: none kept between runs
    env = harness.script_env(UNSTALL_CACHE_KEEP_S="0")
    harness.run_script(command, env, timeout=1800)
    report = json.loads(out.read_text())
    later = report["passes"][1:]
    rate = sum(p["samples"] for p in later) / sum(p["wall_s"] for p in later)
    cpu = sum(p["cpu_s"] for p in later) / sum(p["samples"] for p in later)
    first = report["passes"][0]
    return {
        "rate": rate,
        "cpu_ms": 1000 * cpu,
        "first_rate": first["samples"] / first["wall_s"],
        "cache": _cache_figures(report["cache"]),
    }


def _cache_figures(cache: dict[str, Any] | None) -> dict[str, Any] | None:
    if not cache:
        return None
    keys = ("holds", "hits", "misses", "inserted_bytes", "decoded_samples", "bytes_samples")
    return {k: cache[k] for k in keys if k in cache}


def _large_folder(root: Path, source: str, images: int) -> str:
    """``images`` 1024x768 JPEGs in 10 classes: the demo dataset's first images, enlarged
    (bicubic) and saved at quality 90."""
    from PIL import Image

    found = sorted(os.path.join(d, n) for d, _dirs, names in os.walk(source) for n in names)
    for i, path in enumerate(found[:images]):
        d = root / f"class_{i % 10}"
        d.mkdir(parents=True, exist_ok=True)
        with Image.open(path) as img:
            big = img.convert("RGB").resize(LARGE, Image.Resampling.BICUBIC)
        big.save(d / f"img_{i:05d}.jpg", quality=90)
    old = os.stat(root).st_mtime - 60  # past the cache's recent-write rule
    for d, _dirs, names in os.walk(root):
        for name in names:
            os.utime(os.path.join(d, name), (old, old))
    return os.fspath(root)


def _costs(data: str, pictures: int) -> dict[str, float]:
    """Median thread-CPU ms per training image on one thread, in this process: its JPEG
    decoded (torchvision's loader), the random tail run on the decoded image
    (``RandomResizedCrop`` ... ``Normalize``), a decoded entry read back into an image
    (`codec.decode` of its stored pixels) and the whole ``dataset[i]``: what bounds a
    cache of decoded images, which saves the decode alone and pays the read back."""
    import time

    import numpy as np
    import torch
    import torchvision
    from torchvision import transforms as T

    from unstall.cache.points import codec

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    tail = T.Compose(
        [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(mean, std)]
    )
    dataset = torchvision.datasets.ImageFolder(data, transform=tail)
    load = torchvision.datasets.folder.default_loader
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a loader worker
    spent: dict[str, list[float]] = {"decode": [], "tail": [], "read_back": [], "sample": []}
    try:
        for i in range(min(pictures, len(dataset))):
            path = dataset.samples[i][0]
            stored = codec.encode(load(path))
            for name, work in (
                ("decode", lambda p=path: load(p)),
                ("read_back", lambda b=stored: codec.decode(b)),
                ("tail", lambda b=stored: tail(codec.decode(b))),
                ("sample", lambda i=i: dataset[i]),
            ):
                times = []
                for _ in range(3):  # the least of three: a cache another process thrashed
                    t0 = time.thread_time()
                    work()
                    times.append(time.thread_time() - t0)
                spent[name].append(min(times))
    finally:
        torch.set_num_threads(threads)
    out = {f"{k}_ms": 1000 * float(np.median(v)) for k, v in spent.items()}
    out["tail_ms"] -= out["read_back_ms"]  # timed on a read-back image: its read taken off
    return {k: round(v, 3) for k, v in out.items()}


def _pairs(
    work: Path,
    data: str,
    kind: str,
    base: Any,
    new: Any,
    repeats: int,
    passes: int,
    label: str,
    console: Any,
) -> dict[str, Any]:
    """``repeats`` pairs, alternating which goes first; the median ratio of the pairs."""

    def said(r: int, b: dict[str, Any], n: dict[str, Any]) -> None:
        if console is not None:
            console.print(
                f"  {label} {r + 1}/{repeats}: {b['rate']:.0f} -> "
                f"{n['rate']:.0f} samples/s ({n['rate'] / b['rate']:.2f}x); CPU per sample "
                f"{b['cpu_ms']:.1f} -> {n['cpu_ms']:.1f} ms"
            )

    def side(name: str, cache: Any) -> Any:
        count = iter(range(repeats))
        return lambda: _run(work, data, kind, cache, passes, f"{label}-{name}-{next(count)}")

    runs = harness.run_pairs(
        side("base", base), side("new", new), repeats, rate=lambda run: run["rate"], on_pair=said
    )
    p = runs.rates
    cpu_ratios = [b["cpu_ms"] / n["cpu_ms"] for b, n in zip(runs.base, runs.new, strict=True)]
    return {
        "ratio": p.ratio,
        "ratios": [round(x, 3) for x in p.ratios],
        "cpu_ratio": statistics.median(cpu_ratios),
        "cpu_ratios": [round(x, 3) for x in cpu_ratios],
        "base_cpu_ms": statistics.median(r["cpu_ms"] for r in runs.base),
        "new_cpu_ms": statistics.median(r["cpu_ms"] for r in runs.new),
        "base_rate": p.base_median,
        "new_rate": p.new_median,
        "base_cache": runs.base[-1]["cache"],
        "new_cache": runs.new[-1]["cache"],
    }


def _bound(costs: dict[str, float], pair: dict[str, Any], images: int) -> dict:
    """What bounds a mixed cache against the byte cache of the same size (``pair``): the
    CPU each decoded sample saved (the byte cache's CPU per sample less the mixed one's,
    over the share held decoded), against what `GOAL_MIXED` needed per decoded sample and the
    decode a decoded entry skips (``costs``); and the ceiling at that share: ``dataset[i]``'s
    CPU over itself less the decodes the held samples skip (their reads back paid)."""
    share = (pair["new_cache"] or {}).get("decoded_samples", 0) / max(images, 1)
    base, new = pair["base_cpu_ms"], pair["new_cpu_ms"]
    saved = (base - new) / share if share else 0.0
    need = base * (1 - 1 / GOAL_MIXED) / share if share else float("inf")
    # the most any placement of decoded entries gives at this share: each held sample's
    # decode saved, its read back paid, everything else (the random tail) as before
    spared = share * max(0.0, costs["decode_ms"] - costs["read_back_ms"])
    ceiling = costs["sample_ms"] / (costs["sample_ms"] - spared) if spared else 1.0
    return {
        "decoded_share": round(share, 3),
        "saved_per_decoded_ms": round(saved, 2),
        "needed_per_decoded_ms": round(need, 2),
        "decode_ms": costs["decode_ms"],
        "ceiling": round(ceiling, 3),
    }


def _row(case: str, baseline: str, new: str, pair: dict[str, Any], goal: float) -> dict:
    """A table row for one pair's medians."""
    return {
        "case": case,
        "baseline": baseline,
        "unstall": new,
        "baseline_samples_per_s": round(pair["base_rate"], 1),
        "unstall_samples_per_s": round(pair["new_rate"], 1),
        "ratio": round(pair["ratio"], 3),
        "baseline_cpu_ms": round(pair["base_cpu_ms"], 2),
        "unstall_cpu_ms": round(pair["new_cpu_ms"], 2),
        "cpu_ratio": round(pair["cpu_ratio"], 3),
        "goal": goal,
    }


#: The mixed-placement rows: the cache's budget as a fraction of the decoded training set.
#: `GOAL_BUDGET`'s row is held to `GOAL_MIXED`, the smaller ones to never below the byte cache.
BUDGETS = {"half": 2, "third": 3, "twelfth": 12}
GOAL_BUDGET = "half"


def run(
    *,
    quick: bool,
    console: Any = None,
    repeats: int = 3,
    images: int | None = None,
    budgets: tuple[str, ...] = tuple(BUDGETS),
    cost_images: int = 16,
) -> BenchResult:
    """``images``: validation images (the training set a quarter, at least 12); ``budgets``:
    the mixed rows (of `BUDGETS`); ``cost_images``: training images `_costs` times."""
    from unstall.data.synthetic import ensure_demo_dataset

    if not budgets or not set(budgets) <= set(BUDGETS):
        raise ValueError(f"budgets={budgets!r}: one or more of {tuple(BUDGETS)}")

    images = images or IMAGES["quick" if quick else "full"]
    large = (
        max(12, images // 4)
        if images != IMAGES["quick" if quick else "full"]
        else (LARGE_IMAGES["quick" if quick else "full"])
    )
    data = os.fspath(ensure_demo_dataset(images=images, classes=10, seed=0, progress=False))
    total = read_all(data)
    passes = 3
    with tempfile.TemporaryDirectory(prefix="unstall-bench-cachepoints-") as tmp:
        work = Path(tmp)
        train_data = _large_folder(work / "large", data, large)
        train_total = read_all(train_data)
        costs = _costs(train_data, cost_images)
        decoded_set = large * LARGE[0] * LARGE[1] * 3
        sizes = {label: decoded_set // BUDGETS[label] for label in budgets}
        if console is not None:
            console.print(
                f"  validation: {images} JPEGs of ~500x375 ({total / 2**20:.0f} MiB); training: "
                f"{large} of 1024x768 ({train_total / 2**20:.0f} MiB, decoded "
                f"{decoded_set / 2**20:.0f} MiB); 2 workers, {passes} passes a run"
            )
        samples = {"size": int(images * 224 * 224 * 3 * 4 * 1.3) + (64 << 20), "hold": "samples"}
        val = _pairs(
            work, data, "validation", None, samples, repeats, passes, "validation", console
        )
        mixed = {}
        for label, size in sizes.items():
            mixed[label] = _pairs(
                work,
                train_data,
                "training",
                {"size": size},
                {"size": size, "hold": "auto"},
                repeats,
                passes,
                f"training {label}",
                console,
            )
    rows = [_row("validation pass 2+", "as is", "hold=samples", val, GOAL_VALIDATION)]
    goals = {label: GOAL_MIXED if label == GOAL_BUDGET else 1.0 for label in sizes}
    for label, size in sizes.items():
        case = f"training epoch 2+, budget {label} of decoded ({size / 2**20:.0f} MiB)"
        rows.append(_row(case, "hold=bytes", "hold=auto", mixed[label], goals[label]))
    met = val["ratio"] >= GOAL_VALIDATION and all(
        mixed[label]["ratio"] >= goals[label] for label in sizes
    )
    notes = [
        f"validation: {val['ratio']:.2f}x samples/s (pairs {val['ratios']}; goal >= "
        f"{GOAL_VALIDATION}x); CPU per sample {val['cpu_ratio']:.2f}x less",
    ]
    bounds = {label: _bound(costs, mixed[label], large) for label in sizes}
    for label, pair in mixed.items():
        bound = bounds[label]
        goal = f">= {GOAL_MIXED}x" if label == GOAL_BUDGET else "never below the byte cache"
        notes.append(
            f"mixed placement at a {label} of the decoded set: {pair['ratio']:.2f}x the byte "
            f"cache's samples/s (pairs {pair['ratios']}; goal: {goal}); CPU per sample "
            f"{pair['cpu_ratio']:.2f}x less (pairs {pair['cpu_ratios']}); "
            f"{bound['decoded_share']:.0%} of the samples held decoded, each saving "
            f"{bound['saved_per_decoded_ms']:.1f} ms of CPU; the most any placement of "
            f"decoded images gives at that share: {bound['ceiling']:.2f}x"
        )
    notes.append(
        f"a training image, one thread: decode {costs['decode_ms']:.1f} ms, the random tail "
        f"{costs['tail_ms']:.1f} ms, a decoded entry read back {costs['read_back_ms']:.1f} "
        f"ms, dataset[i] {costs['sample_ms']:.1f} ms"
    )
    notes += [
        "CPU per sample: the script's and its workers' CPU seconds over passes 2-3 "
        "(getrusage; the workers exit at each pass's end), a figure other jobs on the "
        "machine move less than samples/s",
    ]
    return BenchResult(
        name="cachepoints",
        ratio=val["ratio"],
        baseline={"validation_samples_per_s": round(val["base_rate"], 1)},
        unstall={"validation_samples_per_s": round(val["new_rate"], 1)},
        rows=rows,
        detail={
            "quick": quick,
            "goals_met": met,
            "validation": val,
            "mixed": mixed,
            "costs": costs,
            "bounds": bounds,
            "config": {
                "images": images,
                "dataset_bytes": total,
                "training_images": large,
                "training_size": list(LARGE),
                "training_bytes": train_total,
                "decoded_set_bytes": decoded_set,
                "budgets": sizes,
                "repeats": repeats,
                "passes": passes,
                "step_ms": STEP_MS,
                "workers": 2,
            },
        },
        notes=notes,
    )
