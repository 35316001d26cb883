"""`bench s3`: high-latency object storage, torch's one-GET-per-item vs unstall's many in flight.

A real S3-compatible server (SeaweedFS on 127.0.0.1) behind a delaying proxy
adds 0, 10, 20 and 50 ms per request. At each latency, in the same run, with
the same workers, batch size and pipeline: torch's DataLoader over a plain
dataset doing one synchronous GET per ``__getitem__`` (obstore's sync ``get``:
the same Rust client as unstall, so the difference is concurrency alone, not
client speed), then `unstall.DataLoader` over ``FileDataset("s3://...")``.
Both fetch-only (raw bytes) and fetch + prepare (`ImagePipeline`). The ceiling
is GETs/s through the proxy with 128 in flight (from as many processes as the
loaders have workers) and no loader at all.
"""

from __future__ import annotations

import os
import statistics
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch.utils.data

from unstall.bench.harness import BenchResult, Measurement, measure, median_of, row
from unstall.bench.s3_rig import (
    BUCKET,
    CEILING_INFLIGHT,
    WORKERS,
    ProxyProcess,
    measure_ceiling,
    pinned,
    split_cpus,
)
from unstall.testing import SeaweedServer

DESCRIPTION = "S3 at 0-50 ms latency: torch DataLoader one GET per item vs unstall in flight"
LATENCIES_MS = (0, 10, 20, 50)
BATCH = 32


class OneGetPerItem(torch.utils.data.Dataset):
    """The plain baseline: ``__getitem__`` makes one blocking GET (own client per process)."""

    def __init__(self, settings: Any, keys: list[str], transform: Callable | None = None):
        self.settings, self.keys, self.transform = settings, keys, transform
        self._client: Any = None
        self._pid = -1

    def __len__(self) -> int:
        return len(self.keys)

    def __getitem__(self, index: int) -> Any:
        import obstore
        from obstore.store import S3Store as ObStore

        if self._pid != os.getpid():
            kwargs = self.settings.obstore_kwargs(pid=os.getpid())
            kwargs["retry_config"] = {"max_retries": 3}
            self._client, self._pid = ObStore(self.settings.bucket, **kwargs), os.getpid()
        raw = bytes(obstore.get(self._client, self.keys[index]).bytes())
        return (self.transform(raw) if self.transform else raw), index % 10


def raw_collate(batch: list[Any]) -> Any:
    """Fetch-only batches: the bytes as a list, labels as a tensor (same for both loaders)."""
    if isinstance(batch[0][0], bytes):
        return [b for b, _ in batch], torch.tensor([y for _, y in batch])
    return torch.utils.data.default_collate(batch)


class Timed:
    """Iterate ``loader`` for about ``seconds`` after warm-up, then stop (bounds slow baselines)."""

    def __init__(self, loader: Any, seconds: float, warmup_batches: int):
        self.loader, self.seconds, self.warmup = loader, seconds, warmup_batches
        self.iterator: Iterator[Any] | None = None

    def __iter__(self) -> Iterator[Any]:
        # kept on self, so stopping does not shut workers down inside the timed region
        self.iterator = iter(self.loader)
        deadline = None
        for n, batch in enumerate(self.iterator):
            yield batch
            if n + 1 == self.warmup:
                deadline = time.perf_counter() + self.seconds
            # stop past the deadline, on whole rounds: the workers' batches come in turns
            elif deadline and time.perf_counter() > deadline and (n + 1) % WORKERS == 0:
                return


def run(*, quick: bool, console: Any = None) -> BenchResult:
    from unstall.data.synthetic import ensure_demo_dataset
    from unstall.stores import LocalStore

    seconds, repeats = (2.0, 1) if quick else (6.0, 3)
    root = ensure_demo_dataset(images=2048, classes=10, seed=0, progress=False)
    local = LocalStore(root)
    keys = sorted(k for k in local.list() if k.endswith(".jpg"))
    say = console.print if console is not None else print
    with SeaweedServer([BUCKET]) as server:
        from unstall.stores.s3 import S3Store

        t0 = time.perf_counter()
        uploader = S3Store(f"s3://{BUCKET}/train", **server.store_options())
        for i in range(0, len(keys), 256):
            uploader.put_many([(k, local.get(k)) for k in keys[i : i + 256]])
        uploader.close()
        say(f"uploaded {len(keys)} objects in {time.perf_counter() - t0:.1f} s")
        runner = _Runner(server, keys, seconds, repeats)
        results = {str(ms): runner.at_latency(ms, say) for ms in LATENCIES_MS}
        prep_local = runner.local_prep(root)
        split = runner.split_prep(20, root)
        if split:
            say(
                f" 20 ms prep, storage on its own core: unstall {split['s3'].samples_per_s:.0f}/s,"
                f" local files {split['local'].samples_per_s:.0f}/s ({split['fraction']:.0%})"
            )
        cached = runner.cached(20)
        first, later = cached[0].samples_per_s, cached[1].samples_per_s
        say(f"20 ms with Cache: epoch 1 {first:.0f}/s, from epoch 2 {later:.0f}/s")
        default = runner.default_epoch2(20, root, repeats=3 if quick else 5)
        say(
            f"20 ms, defaults only: epoch 2 from the disk tier {default['samples_per_s']:.0f}/s "
            f"({default['requests']} requests), local files {default['local_per_s']:.0f}/s "
            f"({default['local_ratio']:.2f}x)"
        )
    return _result(results, prep_local, split, cached, default, quick=quick)


class _Runner:
    def __init__(self, server: SeaweedServer, keys: list[str], seconds: float, repeats: int):
        self.server, self.keys, self.seconds, self.repeats = server, keys, seconds, repeats

    def loaders(self, endpoint: str, prep: bool) -> dict[str, Callable[[], Any]]:
        import unstall
        from unstall.pipeline import ImagePipeline
        from unstall.stores.s3 import S3Store

        transform = ImagePipeline(output="uint8") if prep else None
        opts = self.server.store_options(endpoint=endpoint)
        url = f"s3://{BUCKET}/train"
        common = {"batch_size": BATCH, "num_workers": WORKERS, "collate_fn": raw_collate}

        def torch_loader() -> Any:
            ds = OneGetPerItem(S3Store(url, **opts).settings, self.keys, transform)
            return torch.utils.data.DataLoader(ds, shuffle=True, **common)

        def unstall_loader() -> Any:
            ds = unstall.FileDataset(
                S3Store(url, **opts),
                self.keys,
                labels=[i % 10 for i in range(len(self.keys))],
                transform=transform,
            )
            # cache=False: every epoch from S3 (a remote dataset's disk tier is on by default)
            return unstall.DataLoader(ds, shuffle=True, cache=False, **common)

        return {"torch": torch_loader, "unstall": unstall_loader}

    def measure(self, make: Callable[[], Any]) -> tuple[Measurement, dict[str, Any]]:
        runs, stats = [], {}
        for _ in range(self.repeats):
            loader = make()
            warm = 2 * WORKERS  # worker start-up, probes and prefetch are not timed
            timed = Timed(loader, self.seconds, warm)
            runs.append(measure(timed, skip_batches=warm))
            timed.iterator = None  # now the workers stop, outside the timing
            if hasattr(loader, "stats"):
                stats = loader.stats().get("store", {})
        return median_of(runs), stats

    def at_latency(self, ms: int, say: Callable[..., Any]) -> dict[str, Any]:
        with ProxyProcess(self.server.endpoint, ms / 1000) as endpoint:
            server, keys = self.server, self.keys
            ceilings = [measure_ceiling(server, endpoint, keys) for _ in range(self.repeats + 1)]
            out: dict[str, Any] = {}
            for variant, prep in (("fetch", False), ("prep", True)):
                makers = self.loaders(endpoint, prep)
                base, _ = self.measure(makers["torch"])
                ours, stats = self.measure(makers["unstall"])
                out[variant] = {
                    "torch": base,
                    "unstall": ours,
                    "ratio": ours.samples_per_s / max(base.samples_per_s, 1e-9),
                    "store": stats,
                }
                ceilings.append(measure_ceiling(server, endpoint, keys))
                ceiling = statistics.median(ceilings)  # before, between and after the loaders
                out["ceiling_per_s"] = round(ceiling, 1)
                say(
                    f"{ms:>3} ms {variant:5}: torch {base.samples_per_s:7.1f}/s, unstall "
                    f"{ours.samples_per_s:7.1f}/s, ceiling {ceiling:7.1f}/s"
                )
        return out

    def cached(self, ms: int) -> tuple[Measurement, Measurement, dict[str, Any]]:
        """unstall fetch-only at ``ms`` latency with `Cache` holding the whole dataset.

        Epoch 1 fills the shared-memory cache from S3; epoch 2 (timed, median of the
        repeats) is served from memory without a request. Returns both epochs and the
        cache stats of epoch 2.
        """
        import unstall
        from unstall.stores.s3 import S3Store

        with ProxyProcess(self.server.endpoint, ms / 1000) as endpoint:
            store = S3Store(f"s3://{BUCKET}/train", **self.server.store_options(endpoint=endpoint))
            labels = [i % 10 for i in range(len(self.keys))]
            ds = unstall.FileDataset(store, self.keys, labels=labels)
            with unstall.Cache(1.0, keep=0) as cache:
                loader = unstall.DataLoader(
                    ds, batch_size=BATCH, num_workers=WORKERS, shuffle=True,
                    collate_fn=raw_collate, cache=cache, persistent_workers=True,
                )  # fmt: skip
                first = measure(loader)
                later = median_of([measure(loader) for _ in range(self.repeats)])
                stats = loader.stats()["per_epoch"][-1].get("cache", {})
                loader.close()
        return first, later, stats

    def default_epoch2(self, ms: int, root: Any, repeats: int) -> dict[str, Any]:
        """Defaults only over S3 at ``ms``: epoch 2+ from the default disk tier, vs local files."""
        from unstall.bench.s3_default import default_epoch2
        from unstall.stores.s3 import S3Store

        labels = [i % 10 for i in range(len(self.keys))]
        common = {"batch_size": BATCH, "num_workers": WORKERS, "collate_fn": raw_collate}
        with ProxyProcess(self.server.endpoint, ms / 1000) as endpoint:
            opts = self.server.store_options(endpoint=endpoint)

            def dataset() -> Any:
                import unstall

                store = S3Store(f"s3://{BUCKET}/train", **opts)
                return unstall.FileDataset(store, self.keys, labels=labels)

            out = default_epoch2(dataset, root, self.keys, common, repeats)
        out["latency_ms"] = ms
        return out

    def split_prep(self, ms: int, root: Any) -> dict[str, Any] | None:
        """Fetch + prepare at ``ms`` against local files, with the server and proxy on a core
        of their own and the loader on the rest, in both runs: storage as if on another machine.

        On one machine the server's CPU per GET (about 0.5 ms for SeaweedFS) comes out of
        the loader's cores; on a real cluster it does not. None with fewer than 2 cores.
        """
        cores = split_cpus()
        if cores is None:
            return None
        ours, storage = cores
        proxy = ProxyProcess(self.server.endpoint, ms / 1000)
        assert self.server.proc is not None
        with proxy as endpoint:
            cpus_of = {os.getpid(): ours, self.server.proc.pid: storage, proxy.pid: storage}
            with pinned(cpus_of), warnings.catch_warnings():
                # torch warns that 2 workers exceed the 1 core left to them: that is the point
                warnings.filterwarnings("ignore", message="This DataLoader will create")
                local = self.local_prep(root)
                s3 = self.measure(self.loaders(endpoint, True)["unstall"])[0]
        return {
            "latency_ms": ms,
            "local": local,
            "s3": s3,
            "fraction": round(s3.samples_per_s / max(local.samples_per_s, 1e-9), 3),
            "loader_cpus": sorted(ours),
            "storage_cpus": sorted(storage),
        }

    def local_prep(self, root: Any) -> Measurement:
        """unstall with the same prepare pipeline from local files: what prep alone allows."""
        import unstall
        from unstall.pipeline import ImagePipeline

        ds = unstall.FileDataset(
            root, self.keys, labels=[0] * len(self.keys), transform=ImagePipeline(output="uint8")
        )
        loader = unstall.DataLoader(
            ds, batch_size=BATCH, num_workers=WORKERS, shuffle=True, collate_fn=raw_collate
        )
        return self.measure(lambda: loader)[0]


def _result(
    results: dict[str, Any],
    prep_local: Measurement,
    split: dict[str, Any] | None,
    cached: tuple[Measurement, Measurement, dict[str, Any]],
    default: dict[str, Any],
    *,
    quick: bool,
) -> BenchResult:
    rows, latency = [], {}
    for ms, r in results.items():
        ceiling = r["ceiling_per_s"]
        for variant in ("fetch", "prep"):
            v = r[variant]
            rows.append(row(f"{ms} ms {variant}", "torch", v["torch"], ceiling=ceiling))
            rows.append(
                row(f"{ms} ms {variant}", "unstall", v["unstall"], v["ratio"], ceiling=ceiling,
                    inflight=v["store"].get("max_inflight"))
            )  # fmt: skip
        latency[ms] = {
            "ratio": round(r["fetch"]["ratio"], 3),
            "ceiling_per_s": ceiling,
            "ceiling_fraction": round(r["fetch"]["unstall"].samples_per_s / ceiling, 3),
            "prep_ratio": round(r["prep"]["ratio"], 3),
            **{
                f"{variant}_{who}_per_s": round(r[variant][who].samples_per_s, 1)
                for variant in ("fetch", "prep")
                for who in ("torch", "unstall")
            },
            "store": r["fetch"]["store"],
        }
    at20 = results["20"]
    ours20 = at20["fetch"]["unstall"].samples_per_s
    prep_fraction = at20["prep"]["unstall"].samples_per_s / max(prep_local.samples_per_s, 1e-9)
    rows.append(row("local prep", "unstall", prep_local))
    if split:
        rows.append(row("split: local prep", "unstall", split.pop("local")))
        rows.append(row("split: 20 ms prep", "unstall", split.pop("s3"), split["fraction"]))
        split["local_per_s"], split["s3_per_s"] = (r["samples_per_s"] for r in rows[-2:])
    first, later, cache_stats = cached
    rows.append(row("20 ms cache ep 1", "unstall", first))
    rows.append(row("20 ms cache ep 2+", "unstall", later))
    cached_rate = later.samples_per_s
    _fill, ours_default, local_default = default.pop("_measurements")
    rows.append(row("20 ms defaults ep 2+", "unstall", ours_default, default["local_ratio"],
                    requests=default["requests"]))  # fmt: skip
    rows.append(row("local files, warm", "unstall", local_default))
    return BenchResult(
        name="s3",
        ratio=at20["fetch"]["ratio"],
        baseline={"samples_per_s": round(at20["fetch"]["torch"].samples_per_s, 1)},
        unstall={
            "samples_per_s": round(ours20, 1),
            "max_inflight": at20["fetch"]["store"].get("max_inflight"),
            "latency_ms": at20["fetch"]["store"].get("latency_ms"),
        },
        rows=rows,
        detail={
            "latency_ms": latency,
            "ceiling_fraction": round(ours20 / at20["ceiling_per_s"], 3),
            "prep_local_per_s": round(prep_local.samples_per_s, 1),
            "prep_fraction_of_local": round(prep_fraction, 3),
            "prep_split_cores": split,
            "cached": {
                "epoch1_per_s": round(first.samples_per_s, 1),
                "epoch2_per_s": round(cached_rate, 1),
                "epoch2_hit_rate": cache_stats.get("hit_rate"),
            },
            "default_epoch2": default,
            "quick": quick,
            "setup": {"batch_size": BATCH, "num_workers": WORKERS, "objects": 2048},
        },
        notes=[
            f"ceiling at 20 ms: {at20['ceiling_per_s']:.0f} GET/s ({CEILING_INFLIGHT} in "
            f"flight from {WORKERS} processes, no loader); "
            f"unstall reaches {ours20 / at20['ceiling_per_s']:.0%} of it",
            f"with prepare at 20 ms: {prep_fraction:.0%} of the same pipeline from local files "
            "(server, proxy and workers share this machine's cores)",
            *(
                [
                    f"with prepare at 20 ms, server and proxy on CPU {split['storage_cpus']}, "
                    f"both loaders on {split['loader_cpus']}: {split['fraction']:.0%} of local "
                    f"files ({split['s3_per_s']:.0f} vs {split['local_per_s']:.0f}/s)"
                ]
                if split
                else []
            ),
            f"20 ms, Cache holding the data: {cached_rate:,.0f}/s fetch-only from epoch 2 "
            f"(hit rate {cache_stats.get('hit_rate')}); `unstall bench shards` measures "
            "Mosaic Streaming and webdataset in the same run",
            f"20 ms, defaults only (no cache= argument): epoch 2+ from the default disk tier at "
            f"{default['samples_per_s']:,.0f}/s with {default['requests']} storage requests, "
            f"{default['local_ratio']:.2f}x the same loader over local files (warm page cache)",
            "baseline: torch DataLoader, one obstore sync GET per __getitem__ (same client)",
        ],
    )
