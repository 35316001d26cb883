"""`bench shards --scale`: the first batch at any dataset size, tar and MDS shards on S3.

``scale_gb`` GB (default 2) in 64 MiB shards of distinct samples (the demo's JPEGs, each
numbered after its end marker), as tars and as MDS shards on SeaweedFS behind the delaying
proxy at 0 and 20 ms, then the tars at twice the size (0 ms: the first batch's flatness).
Per loader: time to first batch and epoch 1 samples/s, both from making the dataset (cold
local caches), epoch 2 samples/s, each epoch checked exactly-once; medians of ``repeats``.
Loaders: unstall on the tars with no index anywhere (trains from its first shard while the
rest land), unstall on the tars with the index beside them (`unstall index URL`), unstall
on the MDS shards, webdataset on the tars, Mosaic Streaming on the MDS shards.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from unstall import machine
from unstall.bench import shards_rig as rig
from unstall.bench.harness import BenchResult, Measurement, row
from unstall.bench.s3_rig import ProxyProcess
from unstall.testing import SeaweedServer

BUCKET = "unstall-shards-scale"
SCALE_GB = 2.0
LOADERS = ("unstall tar", "unstall tar indexed", "unstall mds", "webdataset tar", "mosaic mds")
#: at twice the size (the first batch's flatness): the tar loaders, at the first latency
SIZE_LOADERS = ("unstall tar", "webdataset tar")


def samples(base: list[tuple[bytes, int]], count: int) -> Iterator[tuple[int, bytes, int]]:
    """``count`` distinct samples ``(n, bytes, label)``: base images in turn, each with its
    number after the JPEG's end (decoders stop at the end marker; the bytes differ)."""
    for n in range(count):
        data, label = base[n % len(base)]
        yield n, data + b"\xff\xfe" + f"#{n:010d}".encode(), label


def _put(server: SeaweedServer, prefixes: list[str], files: list[Path]) -> None:
    from unstall.stores.s3 import S3Store

    stores = [S3Store(f"s3://{BUCKET}/{p}", **server.store_options()) for p in prefixes]
    for f in files:  # one shard at a time: the bytes go through the store's helper
        data = f.read_bytes()
        for store in stores:
            store.put(f.name, data)
        f.unlink()
    for store in stores:
        store.close()


def _write_tar(path: Path, group: list[tuple[int, bytes, int]]) -> None:
    """One tar shard as webdataset's ShardWriter lays it out (``<n>.jpg``, ``<n>.cls``)."""
    import io
    import tarfile

    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for n, data, label in group:
            for ext, blob in (("jpg", data), ("cls", str(label).encode())):
                info = tarfile.TarInfo(f"{n:08d}.{ext}")
                info.size, info.mode, info.mtime = len(blob), 0o444, 1_700_000_000
                tf.addfile(info, io.BytesIO(blob))


def build(
    server: SeaweedServer,
    base: list[tuple[bytes, int]],
    gb: float,
    tmp: Path,
    tag: str,
    *,
    mds: bool = True,
) -> dict[str, Any]:
    """Tars and MDS shards of ``gb`` GB under ``s3://BUCKET/<tag>-{tars,mds}``, written and
    uploaded shard by shard (local disk holds one tar shard at a time, the MDS set once)."""
    per = sum(len(d) for d, _ in base) / len(base)
    count = int(gb * 1e9 / per) + 1
    tars = tmp / f"{tag}-tars"
    tars.mkdir()
    n_tars, group, size = 0, [], 0
    for sample in samples(base, count):
        if group and size + len(sample[1]) > rig.SHARD_BYTES:
            _write_tar(tars / f"train-{n_tars:06d}.tar", group)
            _put(server, [f"{tag}-tars"], [tars / f"train-{n_tars:06d}.tar"])
            n_tars, group, size = n_tars + 1, [], 0
        group.append(sample)
        size += len(sample[1]) + 1536
    _write_tar(tars / f"train-{n_tars:06d}.tar", group)
    _put(server, [f"{tag}-tars"], [tars / f"train-{n_tars:06d}.tar"])
    n_tars += 1
    if not mds:  # the size check (2x) runs the tar loaders only
        return {"tag": tag, "samples": count, "tars": n_tars, "bytes": int(per * count)}
    streaming = rig.import_streaming()
    mds = tmp / f"{tag}-mds"
    columns = {"key": "str", "image": "bytes", "label": "int"}
    with streaming.MDSWriter(out=str(mds), columns=columns, size_limit=rig.SHARD_BYTES) as writer:
        for n, data, label in samples(base, count):
            writer.write({"key": f"{n:08d}", "image": data, "label": label})
    shutil.copy(mds / "index.json", tmp / f"{tag}-index.json")
    _put(server, [f"{tag}-mds"], sorted(p for p in mds.iterdir() if p.is_file()))
    return {"tag": tag, "samples": count, "tars": n_tars, "bytes": int(per * count)}


def publish_index(server: SeaweedServer, data: dict[str, Any], tmp: Path) -> float:
    """`unstall index` on the tars (its own cache directory): seconds it took."""
    from unstall.data.shards import TarShards

    cache = tmp / f"{data['tag']}-index-cache"
    with machine.environment({"UNSTALL_CACHE_DIR": str(cache)}):
        t0 = time.perf_counter()
        ds = TarShards(_tar_url(data), image=None, label=None, disk=0, **server.store_options())
        ds.publish_index()
        ds.location.close()
    shutil.rmtree(cache, ignore_errors=True)
    return time.perf_counter() - t0


def _tar_url(data: dict[str, Any]) -> str:
    return f"s3://{BUCKET}/{data['tag']}-tars/train-{{000000..{data['tars'] - 1:06d}}}.tar"


def one_run(
    name: str, server: SeaweedServer, endpoint: str, data: dict[str, Any], tmp: Path
) -> dict[str, Any]:
    """One loader, two epochs: time to first batch, epochs' times, exactly once."""
    os.sync()  # the dataset's and the last run's writes reach the disk before the clock starts
    run_dir = Path(tempfile.mkdtemp(dir=tmp, prefix="run-"))
    env = server.env(endpoint=endpoint)
    env["S3_ENDPOINT_URL"] = endpoint
    env["UNSTALL_CACHE_DIR"] = str(run_dir / "cache")  # cold: no index, copies or tier yet
    try:
        with machine.environment(env):
            return _timed(_maker(name, server, endpoint, data, tmp, run_dir), data["samples"])
    finally:
        rig.clean_mosaic()
        shutil.rmtree(run_dir, ignore_errors=True)


def _maker(
    name: str, server: SeaweedServer, endpoint: str, data: dict[str, Any], tmp: Path, run: Path
) -> Callable[[], Any]:
    tag, n_tars = data["tag"], data["tars"]
    if name == "webdataset tar":
        urls = [f"s3://{BUCKET}/{tag}-tars/train-{s:06d}.tar" for s in range(n_tars)]
        return lambda: rig.webdataset_loader(urls, rig.BATCH, rig.WORKERS, seed=0)
    if name == "mosaic mds":
        local = run / "mosaic"
        local.mkdir()
        shutil.copy(tmp / f"{tag}-index.json", local / "index.json")  # at its best (shards.py)
        return lambda: rig.mosaic_loader(
            f"s3://{BUCKET}/{tag}-mds", str(local), rig.BATCH, rig.WORKERS, 0
        )[0]

    def make() -> Any:
        import unstall
        from unstall.data.shards import MDSShards, TarShards

        opts = server.store_options(endpoint=endpoint)
        if name == "unstall mds":
            ds: Any = MDSShards(f"s3://{BUCKET}/{tag}-mds", image="image", label="label", **opts)
        else:  # "indexed": the index objects beside the shards are read; else ignored
            ds = TarShards(_tar_url(data), beside_index=name.endswith("indexed"), **opts)
        return unstall.DataLoader(
            ds,
            batch_size=rig.BATCH,
            shuffle=True,
            num_workers=rig.WORKERS,
            collate_fn=rig.image_bytes,
        )

    return make


def _timed(make: Callable[[], Any], n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"epochs_s": [], "exact": []}
    t0 = time.perf_counter()
    loader = make()
    for _epoch in range(2):
        ids: list[int] = []
        for batch in loader:
            if "first_batch_s" not in out:
                out["first_batch_s"] = time.perf_counter() - t0
            ids.extend(_number(x) for x in batch)
        out["epochs_s"].append(time.perf_counter() - t0)
        out["exact"].append(sorted(ids) == list(range(n)))
        t0 = time.perf_counter()
    del loader
    return out


def _number(raw: bytes) -> int:
    """The sample's own number, from its last 10 bytes (see `samples`)."""
    tail = bytes(raw[-11:])
    return int(tail[1:]) if tail[:1] == b"#" else -1


def run(
    *, quick: bool, console: Any = None, scale_gb: float = SCALE_GB, runs: int = 1
) -> BenchResult:
    """Build the datasets once, then ``runs`` rounds of every loader (each round at every
    latency, loaders in turn, so slow phases of a shared machine spread over all of them);
    each cell is the median of its runs (`_median`)."""
    from unstall.data.synthetic import ensure_demo_dataset
    from unstall.stores import LocalStore

    say = console.print if console is not None else print
    root = ensure_demo_dataset(images=2048, classes=10, seed=0, progress=False)
    local = LocalStore(root)
    keys = sorted(k for k in local.list() if k.endswith(".jpg"))
    classes = sorted({k.split("/", 1)[0] for k in keys})
    base = [(local.get(k), classes.index(k.split("/", 1)[0])) for k in keys]
    results: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = {}
    sizes = {"1x": scale_gb, "2x": 2 * scale_gb}
    with (
        tempfile.TemporaryDirectory(prefix="unstall-bench-scale-") as tmp_dir,
        # room for the tars and MDS at 1x and the tars at 2x (volumes of 256 MB, half spare)
        SeaweedServer([BUCKET], volume_max=int(4 * scale_gb * 1e9 / 256e6 * 1.5) + 16) as server,
    ):
        tmp = Path(tmp_dir)
        built = {}
        for tag, gb in sizes.items():
            t0 = time.perf_counter()
            built[tag] = data = build(server, base, gb, tmp, tag, mds=tag == "1x")
            data["index_s"] = round(publish_index(server, data, tmp), 2) if tag == "1x" else None
            say(f"{tag}: {data['samples']:,} samples, {data['tars']} tar shards, "
                f"{data['bytes'] / 1e9:.2f} GB, made in {time.perf_counter() - t0:.0f} s, "
                f"`unstall index` {data['index_s']} s")  # fmt: skip
        for r in range(runs):
            for ms in rig.LATENCIES_MS:
                with ProxyProcess(server.endpoint, ms / 1000) as endpoint:
                    for tag, data in built.items():
                        if tag == "2x" and ms != rig.LATENCIES_MS[0]:
                            continue  # the flatness check at one latency (time on 2 cores)
                        for name in LOADERS if tag == "1x" else SIZE_LOADERS:
                            got = one_run(name, server, endpoint, data, tmp)
                            results.setdefault(tag, {}).setdefault(ms, {}).setdefault(
                                name, []
                            ).append(got)
                            say(f"run {r + 1}/{runs} " + _line(tag, ms, name, got, data["samples"]))
    return _result(
        {t: {ms: {n: _median(g) for n, g in b.items()} for ms, b in m.items()}
         for t, m in results.items()},
        built, scale_gb=scale_gb, quick=quick, runs=results,
    )  # fmt: skip


def _median(gots: list[dict[str, Any]]) -> dict[str, Any]:
    """One loader's runs as one: the median time to first batch and of each epoch's time,
    exactly once only if every run was."""
    return {
        "first_batch_s": statistics.median(g["first_batch_s"] for g in gots),
        "epochs_s": [statistics.median(g["epochs_s"][e] for g in gots) for e in (0, 1)],
        "exact": [all(all(g["exact"]) for g in gots)],
    }


def _line(tag: str, ms: int, name: str, got: dict[str, Any], n: int) -> str:
    e1, e2 = (n / got["epochs_s"][e] for e in (0, 1))
    return (f"{tag} {ms:>3} ms {name:20}: first batch {got['first_batch_s']:6.2f} s, epoch 1 "
            f"{e1:7.0f}/s, epoch 2 {e2:7.0f}/s, exact {all(got['exact'])}")  # fmt: skip


def _result(
    results: dict[str, dict[int, dict[str, dict[str, Any]]]],
    built: dict[str, dict[str, Any]],
    *,
    scale_gb: float,
    quick: bool,
    runs: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] | None = None,
) -> BenchResult:
    rows, per = [], {}
    every = {  # each run's figures, beside the medians
        tag: {
            str(ms): {
                name: [
                    {
                        "first_batch_s": round(g["first_batch_s"], 3),
                        "epoch1_per_s": round(built[tag]["samples"] / g["epochs_s"][0], 1),
                        "epoch2_per_s": round(built[tag]["samples"] / g["epochs_s"][1], 1),
                        "exact": all(g["exact"]),
                    }
                    for g in gots
                ]
                for name, gots in by_loader.items()
            }
            for ms, by_loader in by_ms.items()
        }
        for tag, by_ms in (runs or {}).items()
    }
    n_runs = max((len(g) for m in (runs or {}).values() for b in m.values() for g in b.values()),
                 default=1)  # fmt: skip
    for tag, by_ms in results.items():
        n = built[tag]["samples"]
        for ms, by_loader in by_ms.items():
            for name, got in by_loader.items():
                e1, e2 = (n / got["epochs_s"][e] for e in (0, 1))
                per.setdefault(tag, {}).setdefault(str(ms), {})[name] = {
                    "first_batch_s": round(got["first_batch_s"], 3),
                    "epoch1_per_s": round(e1, 1),
                    "epoch2_per_s": round(e2, 1),
                    "exact": all(got["exact"]),
                }
                m = Measurement(samples=n, wall_s=got["epochs_s"][0], wait_s=0.0, compute_s=0.0,
                                batches=-(-n // rig.BATCH))  # fmt: skip
                rows.append(row(f"{tag} {ms} ms", name, m, None,
                                first_batch_s=round(got["first_batch_s"], 3),
                                epoch2_per_s=round(e2, 1), exact=all(got["exact"])))  # fmt: skip
    goals = {}
    for ms in map(str, rig.LATENCIES_MS):
        one = per.get("1x", {}).get(ms)
        two = per.get("2x", {}).get(ms)
        if not one:
            continue
        wds, mosaic = one["webdataset tar"], one["mosaic mds"]
        g = {}
        for name in ("unstall tar", "unstall tar indexed"):
            u = one[name]
            g[name] = {
                "first_batch_vs_webdataset": round(u["first_batch_s"] / wds["first_batch_s"], 3),
                "epoch1_vs_webdataset": round(u["epoch1_per_s"] / wds["epoch1_per_s"], 3),
                "epoch1_vs_mosaic": round(u["epoch1_per_s"] / mosaic["epoch1_per_s"], 3),
                "epoch2_vs_webdataset": round(u["epoch2_per_s"] / wds["epoch2_per_s"], 3),
                "first_batch_2x_vs_1x": (
                    round(two[name]["first_batch_s"] / u["first_batch_s"], 3)
                    if two and name in two
                    else None
                ),
            }
        goals[ms] = g
    checks = goal_lines(goals)
    indexed = goals.get("0", {}).get("unstall tar indexed", {})
    exact = all(v["exact"] for by in per.values() for m in by.values() for v in m.values())
    return BenchResult(
        name="shards-scale",
        ratio=indexed.get("epoch1_vs_webdataset") or 0.0,
        baseline={"loader": "webdataset tar"},
        unstall={"loader": "unstall tar indexed"},
        rows=rows,
        detail={
            "per_size": per,
            "per_run": every,
            "goals": goals,
            "exact": exact,
            "datasets": built,
            "quick": quick,
            "setup": {
                "scale_gb": scale_gb,
                "batch_size": rig.BATCH,
                "num_workers": rig.WORKERS,
                "fetch_only": True,
                "shard_bytes": rig.SHARD_BYTES,
                "runs": n_runs,
            },
        },
        notes=[
            "first batch: from making the dataset (cold local caches) to the first batch; "
            "epoch 1: from making the dataset to its last batch; epoch 2: the next pass; "
            f"each cell the median of {n_runs} run(s) (each run in detail.per_run)",
            "unstall tar: no index anywhere (the first shard is indexed as the dataset is made, "
            "the others as they land in the background; epoch 1 streams in key-order shard "
            "windows before len() is known); unstall tar indexed: the index beside the "
            "shards (`unstall index`, its time in datasets.*.index_s), read by a node with an "
            "empty cache directory",
            "goals: first batch <= 2x webdataset's, epoch 1 >= 1.2x webdataset and "
            ">= 1.5x Mosaic, epoch 2 >= 3x webdataset, first batch at 2x size <= 1.2x",
            *checks,
        ],
    )


#: (key in ``goals``, what, goal, at most (True) or at least (False))
GOALS = (
    ("first_batch_vs_webdataset", "first batch / webdataset's", 2.0, True),
    ("epoch1_vs_webdataset", "epoch 1 / webdataset", 1.2, False),
    ("epoch1_vs_mosaic", "epoch 1 / Mosaic", 1.5, False),
    ("epoch2_vs_webdataset", "epoch 2 / webdataset", 3.0, False),
    ("first_batch_2x_vs_1x", "first batch at 2x size / 1x", 1.2, True),
)


def goal_lines(goals: dict[str, dict[str, dict[str, float | None]]]) -> list[str]:
    """One line per latency and unstall loader: each ratio against its goal, met or not."""
    out = []
    for ms, by_loader in goals.items():
        for name, got in by_loader.items():
            parts = []
            for key, what, goal, at_most in GOALS:
                if (value := got.get(key)) is not None:
                    met = value <= goal if at_most else value >= goal
                    goal_is = f"goal {'<=' if at_most else '>='} {goal}"
                    parts.append(f"{what} {value:.2f}x ({goal_is}: {'met' if met else 'NOT met'})")
            out.append(f"{ms} ms, {name}: " + "; ".join(parts))
    return out
