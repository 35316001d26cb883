"""`bench cache`: a dataset twice the cache, storage the bottleneck, shuffled epochs.

Three loaders read the same files through the same `ThrottledStore` link (one
shared throughput for all worker processes), 3 epochs each, in the same run:

- ``torch``: `torch.utils.data.DataLoader`, one read per sample, with the page
  cache. The real page cache here would hold the whole dataset (this machine has
  far more RAM than the data), which is not the situation being studied, so
  every variant reads around it (``posix_fadvise(DONTNEED)``) and the page cache
  is modelled by an LRU of the same capacity in front of the link: the policy
  the kernel uses, at the same memory budget.
- ``lru``: `unstall.DataLoader` with ``Cache(C, policy="lru")``.
- ``noevict``: `unstall.DataLoader` with ``Cache(C)`` (the default policy).

With storage the bottleneck an epoch takes (1 - h) * N * size / bandwidth, so
the model's prediction is printed next to each measured epoch.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
from typing import Any

import torch

from unstall.bench.harness import BenchResult, Measurement, measure, row
from unstall.cache import Cache
from unstall.data import FileDataset
from unstall.loader import DataLoader
from unstall.stores.local import LocalStore
from unstall.testing.throttle import ThrottledStore

DESCRIPTION = "no-eviction shm cache vs LRU and the page cache, dataset 2x cache, slow storage"
EPOCHS = 3
VARIANTS = ("torch", "lru", "noevict")


class PageCached(torch.utils.data.Dataset):
    """Per-sample reads through an LRU cache layer: the page cache, at a set capacity."""

    def __init__(self, dataset: FileDataset, layer: Any):
        self.dataset, self.layer = dataset, layer

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> bytes:
        return self.layer.fetch(self.dataset, [index])[0]


def _write_dataset(root: str, n: int, size: int) -> list[str]:
    store = LocalStore(root)
    keys = [f"{i:06d}.bin" for i in range(n)]
    for i, key in enumerate(keys):
        store.put(key, os.urandom(16) + i.to_bytes(8, "little") * ((size - 16) // 8))
    store.drop_page_cache()
    return keys


def _run_variant(variant: str, root: str, keys: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Three epochs of one loader; per epoch: samples/s, hit rate, storage bytes."""
    local = LocalStore(root, bypass_page_cache=True)
    local.drop_page_cache()
    store = ThrottledStore(local, bytes_per_s=cfg["bytes_per_s"])
    dataset = FileDataset(store, keys)
    policy = "noevict" if variant == "noevict" else "lru"
    cache = Cache(cfg["capacity_fraction"], policy=policy, name=f"bench-{variant}", keep=0)
    opts = {"batch_size": cfg["batch_size"], "num_workers": cfg["workers"], "shuffle": True}
    counters: list[dict[str, int]] = []
    if variant == "torch":
        layer = cache.bind(dataset)
        loader: Any = torch.utils.data.DataLoader(
            PageCached(dataset, layer), collate_fn=list, **opts
        )
        cache_stats = layer.stats
    else:
        loader = DataLoader(dataset, cache=cache, seed=cfg["seed"], **opts)
        cache_stats = loader.stats

    def snapshot() -> dict[str, int]:
        c = cache_stats()["cache"]
        return {"hits": c["hits"], "misses": c["misses"], **_storage(store)}

    epochs: list[Measurement] = []
    try:
        counters.append(snapshot())
        for _ in range(EPOCHS):
            epochs.append(measure(loader))
            counters.append(snapshot())
        capacity = cache_stats()["cache"]["capacity_bytes"]
        second = _second_job(store, keys, cfg) if variant == "noevict" else None
    finally:
        cache.close()
        store.close()
    out: dict[str, Any] = {"epochs": [m.as_dict() for m in epochs], "capacity_bytes": capacity}
    if second is not None:
        out["second_job"] = second
    hit_rate, predicted, stored = [], [], []
    for e in range(len(epochs)):
        d = {k: counters[e + 1][k] - counters[e][k] for k in counters[0]}
        h = d["hits"] / max(1, d["hits"] + d["misses"])
        hit_rate.append(round(h, 4))
        stored.append(d["bytes"])
        predicted.append((1 - h) * cfg["dataset_bytes"] / cfg["bytes_per_s"])
    out["hit_rate"] = hit_rate
    out["storage_bytes"] = stored
    out["epoch_s"] = [round(m.wall_s, 3) for m in epochs]
    out["predicted_epoch_s"] = [round(p, 3) for p in predicted]
    out["samples_per_s"] = [round(m.samples_per_s, 1) for m in epochs]
    later = epochs[1:]
    out["samples_per_s_from_epoch2"] = round(
        sum(m.samples for m in later) / sum(m.wall_s for m in later), 1
    )
    return out


def _second_job(store: ThrottledStore, keys: list[str], cfg: dict[str, Any]) -> dict[str, Any]:
    """Another user of the same segment (as a second job of an HP sweep): its first epoch."""
    with Cache(cfg["capacity_fraction"], name="bench-noevict", keep=0) as cache:
        loader = DataLoader(
            FileDataset(store, keys),
            batch_size=cfg["batch_size"],
            num_workers=cfg["workers"],
            shuffle=True,
            seed=cfg["seed"] + 1,
            cache=cache,
        )
        m = measure(loader)
        stats = loader.stats()["cache"]
    h = stats["hits"] / max(1, stats["hits"] + stats["misses"])
    return {
        "opened": stats["opened"],
        "hit_rate": [round(h, 4)],
        "epoch_s": [round(m.wall_s, 3)],
        "predicted_epoch_s": [round((1 - h) * cfg["dataset_bytes"] / cfg["bytes_per_s"], 3)],
        "samples_per_s": [round(m.samples_per_s, 1)],
    }


def _storage(store: ThrottledStore) -> dict[str, int]:
    s = store.stats()["storage"]
    return {"bytes": s["bytes"], "requests": s["requests"]}


def run(*, quick: bool, console: Any = None, repeats: int | None = None) -> BenchResult:
    n, size = (1024, 32 << 10) if quick else (4096, 64 << 10)
    repeats = repeats or 3
    cfg: dict[str, Any] = {
        "capacity_fraction": 0.5,
        "bytes_per_s": float(n * size),  # a fully missing epoch takes 1 s (quick) / 4 s
        "batch_size": 32,
        "workers": 2,
        "seed": 0,
        "dataset_bytes": n * ((size - 16) // 8 * 8 + 16),
    }
    if not quick:
        cfg["bytes_per_s"] = n * size / 4.0
    root = tempfile.mkdtemp(prefix="unstall-bench-cache-")
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    try:
        keys = _write_dataset(root, n, size)
        for r in range(repeats):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]  # drift hits all alike
            for variant in order:
                res = _run_variant(variant, root, keys, cfg)
                runs[variant].append(res)
                if console is not None:
                    console.print(
                        f"  run {r + 1}/{repeats} {variant:8s} hit rate {res['hit_rate']} "
                        f"epoch s {res['epoch_s']} (model {res['predicted_epoch_s']})"
                    )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return _result(runs, cfg, n, size, repeats)


def _median_run(results: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(results, key=lambda r: r["samples_per_s_from_epoch2"])
    return ordered[len(ordered) // 2]


def _result(
    runs: dict[str, list[dict[str, Any]]], cfg: dict[str, Any], n: int, size: int, repeats: int
) -> BenchResult:
    med = {v: _median_run(runs[v]) for v in VARIANTS}
    speed = {
        v: statistics.median(r["samples_per_s_from_epoch2"] for r in runs[v]) for v in VARIANTS
    }
    ratio = speed["noevict"] / speed["torch"]
    c = cfg["capacity_fraction"]
    rows = []
    for v in VARIANTS:
        for e in range(EPOCHS):
            m = Measurement(**{k: med[v]["epochs"][e][k] for k in Measurement.__dataclass_fields__})
            rows.append(
                row(
                    f"epoch {e + 1}",
                    v,
                    m,
                    m.samples_per_s / med["torch"]["samples_per_s"][e],
                    hit_rate=med[v]["hit_rate"][e],
                    epoch_s=med[v]["epoch_s"][e],
                    model_s=med[v]["predicted_epoch_s"][e],
                )
            )
    goal = min(med["noevict"]["hit_rate"][1:]) >= 0.98 * c
    variants = {
        v: {
            **med[v],
            "runs_samples_per_s_from_epoch2": [r["samples_per_s_from_epoch2"] for r in runs[v]],
        }
        for v in VARIANTS
    }
    return BenchResult(
        name="cache",
        ratio=ratio,
        baseline={
            "loader": "torch.utils.data.DataLoader + page cache (LRU model, same capacity)",
            "samples_per_s": round(speed["torch"], 1),
            "hit_rate": med["torch"]["hit_rate"],
        },
        unstall={
            "loader": "unstall.DataLoader + unstall.Cache (noevict)",
            "samples_per_s": round(speed["noevict"], 1),
            "hit_rate": med["noevict"]["hit_rate"],
        },
        rows=rows,
        detail={
            "capacity_fraction": c,
            "items": n,
            "item_bytes": size,
            "bytes_per_s_limit": cfg["bytes_per_s"],
            "epochs": EPOCHS,
            "repeats": repeats,
            "variants": variants,
            "ratios": {
                "noevict_vs_torch": round(ratio, 4),
                "noevict_vs_lru": round(speed["noevict"] / speed["lru"], 4),
                "lru_vs_torch": round(speed["lru"] / speed["torch"], 4),
            },
            "goal_hit_rate_met": goal,
        },
        notes=[
            f"dataset {n} x {size >> 10} KiB, cache {c:.0%} of it, storage limited to "
            f"{cfg['bytes_per_s'] / 1e6:.1f} MB/s shared by all workers; medians of {repeats}",
            "ratio: samples/s from epoch 2 on, noevict over torch DataLoader + page cache (LRU)",
            f"goal: noevict hit rate >= {0.98 * c:.3f} from epoch 2: "
            f"{'met' if goal else 'NOT met'} ({med['noevict']['hit_rate'][1:]})",
            "second job (another loader attaching to the filled segment), first epoch: hit rate "
            f"{med['noevict']['second_job']['hit_rate'][0]}, "
            f"{med['noevict']['second_job']['epoch_s'][0]} s",
            "model_s: (1 - hit rate) x dataset bytes / storage bandwidth",
        ],
    )
