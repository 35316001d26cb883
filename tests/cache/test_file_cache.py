"""Issue 40: the node cache for datasets that open their files themselves.

Every script here is an ordinary torch script (nothing of unstall in it), run as it is
and under ``unstall run --config c.json`` with ``{"kwargs": {"cache": ...}}``. Each sample
comes back with the digest of what the dataset read and the storage bytes its worker had
read so far (``/proc/self/io`` ``read_bytes``); the scripts drop the page cache of their
files between epochs (``posix_fadvise(DONTNEED)``), as the analyzer's cold run does.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import unstall
from tests import forked
from unstall.cache import clear_caches, list_caches
from unstall.cache.shm import segment
from unstall.loader import file_hook

REPO = Path(__file__).resolve().parents[2]
N = 32
SIZE = 24 * 1024

SCRIPT = r"""
import hashlib, json, os, sys
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

kind, root, epochs, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rewrite = sys.argv[5] == "rewrite" if len(sys.argv) > 5 else False
paths = sorted(os.path.join(root, n) for n in os.listdir(root) if not n.startswith("scratch"))


def storage_read():
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("read_bytes")).split()[1])


def digest(raw):
    return hashlib.md5(raw).hexdigest()


def load(path):
    if kind == "pil":
        from PIL import Image
        with Image.open(path) as img:
            return digest(img.convert("RGB").tobytes())
    with open(path, "rb") as f:
        return digest(f.read())


class Folder(Dataset):  # torchvision-style: (path, class) pairs in .samples
    def __init__(self, paths):
        self.samples = [(p, i % 3) for i, p in enumerate(paths)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, i):
        path, target = self.samples[i]
        return i, load(path), os.getpid(), storage_read()


class Stream(IterableDataset):
    def __init__(self, paths):
        self.paths = paths

    def __iter__(self):
        info = get_worker_info()
        mine = range(len(self.paths))
        if info is not None:
            mine = mine[info.id :: info.num_workers]
        for i in mine:
            yield i, load(self.paths[i]), os.getpid(), storage_read()


class Unsafe(Dataset):  # mmap, fileno and files it writes itself, all among its own files
    def __init__(self, paths):
        self.files = paths + [os.path.join(root, f"scratch{i:03d}") for i in range(len(paths))]
        self.n = len(paths)

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        arr = np.load(self.files[i], mmap_mode="r")
        mapped = int(arr.sum())
        with open(self.files[i], "rb") as f:
            head = digest(os.read(f.fileno(), 64))
            size = os.fstat(f.fileno()).st_size
        token = os.urandom(32) * (i + 1)
        with open(self.files[self.n + i], "wb") as f:
            f.write(token)
        with open(self.files[self.n + i], "rb") as f:
            back = f.read() == token
        return i, f"{mapped}:{head}:{size}:{back}", os.getpid(), storage_read()


class Unlisted(Dataset):  # names its files only in __getitem__: nothing to size a cache on
    def __init__(self, root, n):
        self.root, self.n = root, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i, load(paths[i]), os.getpid(), storage_read()


def drop_page_cache():
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def keep(batch):
    return batch


if kind == "iterable":
    ds = Stream(paths)
elif kind == "unsafe":
    ds = Unsafe(paths)
elif kind == "unlisted":
    ds = Unlisted(root, len(paths))
else:
    ds = Folder(paths)
loader = DataLoader(ds, batch_size=4, shuffle=kind != "iterable", num_workers=2, collate_fn=keep)
report = {"epochs": [], "stats": []}
for epoch in range(epochs):
    drop_page_cache()
    samples = [s for batch in loader for s in batch]
    read = {}
    for _i, _d, pid, done in samples:
        read[pid] = max(read.get(pid, 0), done)
    report["epochs"].append({
        "samples": sorted([i, d] for i, d, _p, _r in samples),
        "storage_bytes": sum(read.values()),
    })
    stats = getattr(loader, "stats", None)  # present under unstall: its figures
    report["stats"].append(stats().get("cache") if stats is not None else None)
    if rewrite and epoch == 0:  # same names and sizes, new bytes, for every fourth file
        for p in paths[::4]:
            with open(p, "r+b") as f:
                f.write(b"rewritten" + os.path.basename(p).encode())
with open(out, "w") as f:
    json.dump(report, f)
"""


def make_files(root: Path, kind: str = "bin") -> list[Path]:
    """``N`` files of ``SIZE`` bytes each (PNG: noise images of about that size), dated back
    past the cache's recent-write rule and flushed to disk."""
    root.mkdir()
    rng = np.random.default_rng(40)
    paths = []
    for i in range(N):
        if kind == "png":
            from PIL import Image

            path = root / f"{i:03d}.png"
            noise = rng.integers(0, 256, (48, 160, 3), dtype=np.uint8)
            Image.fromarray(noise).save(path)
        elif kind == "npy":
            path = root / f"{i:03d}.npy"
            np.save(path, rng.integers(0, 1000, SIZE // 8, dtype=np.int64))
            (root / f"scratch{i:03d}").write_bytes(b"")
        else:
            path = root / f"{i:03d}.bin"
            path.write_bytes(rng.bytes(SIZE))
        paths.append(path)
    old = time.time_ns() - 60 * 10**9
    for path in root.iterdir():
        os.utime(path, ns=(old, old))
    os.sync()
    return paths


@pytest.fixture(scope="module")
def as_is():
    """The scripts as they are (no cache, torch's loader) forked from a fork server that
    imported torch once (`tests.forked`): each still its own process, started in a fraction
    of a second instead of 2-3 s of CPU importing torch (eight runs in this module)."""
    with forked.server(("torch", "numpy", "PIL.Image", "hashlib")) as ctx:
        yield ctx


def run(
    tmp_path: Path,
    kind: str,
    root: Path,
    *,
    as_is: object = None,
    cache: object = None,
    epochs: int = 2,
    extra: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    tag: str = "",
) -> tuple[dict, str]:
    """The script's report and stderr: as it is (``cache=None``: forked from ``as_is``, the
    `as_is` fork server) or under ``unstall run`` (a fresh interpreter, started by it)."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / f"out-{kind}-{cache is not None}{tag}.json"
    argv = [str(script), kind, str(root), str(epochs), str(out), *extra]
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    if cache is None:
        proc = forked.Forked(as_is, argv, env=environ, cwd=tmp_path, output=out, text=True)
        try:
            _, err = proc.communicate(timeout=240)
        finally:
            proc.kill()  # (ended already, unless it ran past its time)
        assert proc.returncode == 0, err[-4000:]
        return json.loads(out.read_text()), err
    config = tmp_path / "c.json"
    config.write_text(json.dumps({"kwargs": {"cache": cache}}))
    command = [sys.executable, "-m", "unstall", "run", "--config", str(config), "--"]
    done = subprocess.run(
        [*command, sys.executable, *argv],
        capture_output=True,
        text=True,
        env=environ,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return json.loads(out.read_text()), done.stderr


def shm_files() -> list[str]:
    """This test's shared-memory files (its namespace, which its scripts inherit): tests
    running beside it on another process make their own."""
    prefix = segment.name_prefix()
    return sorted(n for n in os.listdir(segment.shm_dir()) if n.startswith(prefix))


def per_epoch(stats: list[dict]) -> list[dict]:
    """Per-epoch figures from the cumulative ones the script recorded after each epoch."""
    keys = ("hits", "misses", "stale", "inserted")
    out, before = [], dict.fromkeys(keys, 0)
    for s in stats:
        out.append({k: s[k] - before[k] for k in keys} | {"items_cached": s["items_cached"]})
        before = s
    return out


@pytest.mark.timeout(600)
def test_paths_and_open_epoch_two_from_the_cache_at_c_over_n(tmp_path, as_is):
    root = tmp_path / "data"
    make_files(root)
    before = shm_files()
    plain, _ = run(tmp_path, "open", root, as_is=as_is)
    cached, err = run(tmp_path, "open", root, cache=0.5)
    assert "caching the 32 files Folder.samples lists" in err
    for a, b in zip(plain["epochs"], cached["epochs"], strict=True):
        assert a["samples"] == b["samples"]  # the same samples, the same bytes
        assert [i for i, _ in a["samples"]] == list(range(N))
    first, second = per_epoch(cached["stats"])
    assert (first["hits"], first["misses"], first["inserted"]) == (0, N, N // 2)
    assert (second["hits"], second["misses"], second["stale"]) == (N // 2, N // 2, 0)
    assert second["items_cached"] == N // 2  # C/N of epoch 2 from the cache
    # what the workers read from storage, the page cache dropped between epochs
    torch_bytes = plain["epochs"][1]["storage_bytes"]
    assert torch_bytes >= 0.9 * N * SIZE
    assert cached["epochs"][0]["storage_bytes"] >= 0.9 * N * SIZE
    assert cached["epochs"][1]["storage_bytes"] <= 0.55 * torch_bytes
    assert shm_files() == before  # nothing left (keep 0 in tests)


@pytest.mark.timeout(600)
def test_paths_and_pil_the_same_pixels_and_hits(tmp_path, as_is):
    root = tmp_path / "data"
    make_files(root, "png")
    plain, _ = run(tmp_path, "pil", root, as_is=as_is)
    cached, _ = run(tmp_path, "pil", root, cache=0.5)
    assert [e["samples"] for e in plain["epochs"]] == [e["samples"] for e in cached["epochs"]]
    first, second = per_epoch(cached["stats"])
    assert first["misses"] == N and second["hits"] == first["inserted"] > 0
    assert abs(second["items_cached"] / N - 0.5) <= 0.15


@pytest.mark.timeout(600)
def test_an_iterable_dataset(tmp_path, as_is):
    root = tmp_path / "data"
    make_files(root)
    plain, _ = run(tmp_path, "iterable", root, as_is=as_is)
    cached, _ = run(tmp_path, "iterable", root, cache=0.5)
    assert [e["samples"] for e in plain["epochs"]] == [e["samples"] for e in cached["epochs"]]
    first, second = per_epoch(cached["stats"])
    assert (first["misses"], first["inserted"]) == (N, N // 2)
    assert (second["hits"], second["misses"]) == (N // 2, N // 2)
    assert cached["epochs"][1]["storage_bytes"] <= 0.55 * plain["epochs"][1]["storage_bytes"]


@pytest.mark.timeout(600)
def test_a_file_rewritten_between_epochs_is_read_anew(tmp_path, as_is):
    root = tmp_path / "data"
    make_files(root)
    plain, _ = run(tmp_path, "open", root, as_is=as_is, epochs=3, extra=("rewrite",))
    for path in root.iterdir():  # the first run rewrote them: back to the same bytes
        path.unlink()
    root.rmdir()
    make_files(root)
    cached, _ = run(tmp_path, "open", root, cache="64MiB", epochs=3, extra=("rewrite",))
    assert [e["samples"] for e in plain["epochs"]] == [e["samples"] for e in cached["epochs"]]
    assert plain["epochs"][0]["samples"] != plain["epochs"][1]["samples"]  # new bytes served
    changed = len(range(0, N, 4))
    first, second, third = per_epoch(cached["stats"])
    assert (first["misses"], first["inserted"]) == (N, N)
    assert (second["hits"], second["stale"], second["misses"]) == (N - changed, changed, changed)
    # just written: read from the file again, not stored while its mtime is too recent to
    # trust (stored later, once older than that)
    assert (third["hits"], third["stale"]) == (N - changed, changed)


@pytest.mark.timeout(600)
def test_mmap_fileno_and_files_the_dataset_writes_work_as_without_unstall(tmp_path, as_is):
    root = tmp_path / "data"
    make_files(root, "npy")
    plain, _ = run(tmp_path, "unsafe", root, as_is=as_is)
    cached, _ = run(tmp_path, "unsafe", root, cache="64MiB")
    for a, b in zip(plain["epochs"], cached["epochs"], strict=True):
        assert a["samples"] == b["samples"]
        assert all(d.endswith(":True") for _, d in b["samples"])  # wrote, read back the same
    first, second = per_epoch(cached["stats"])
    # the .npy files were cached (np.load opens them "rb"); the scratch files never are
    assert first["inserted"] == N and second["hits"] >= N


@pytest.mark.timeout(600)
def test_two_jobs_share_one_segment_kept_by_todays_rules(tmp_path):
    root = tmp_path / "data"
    make_files(root)
    keep = {"UNSTALL_CACHE_KEEP_S": "60"}
    try:
        first, _ = run(tmp_path, "open", root, cache=0.5, epochs=1, env=keep, tag="1")
        (seg,) = [c for c in list_caches() if c["tier"] == "ram"]
        assert seg["items_cached"] == N // 2 and seg["users_alive"] == []
        second, _ = run(tmp_path, "open", root, cache=0.5, epochs=1, env=keep, tag="2")
        assert first["epochs"][0]["samples"] == second["epochs"][0]["samples"]
        (stats,) = second["stats"]
        assert (stats["hits"], stats["opened"], stats["level"]) == (N // 2, "kept", "file")
        assert [c["name"] for c in list_caches() if c["tier"] == "ram"] == [seg["name"]]
        assert second["epochs"][0]["storage_bytes"] <= 0.55 * first["epochs"][0]["storage_bytes"]
    finally:
        removed = clear_caches()
    assert len([r for r in removed if not r.endswith("(disk)")]) == 1


@pytest.mark.timeout(300)
def test_a_cache_that_cannot_apply_says_why_and_the_job_runs(tmp_path, as_is):
    root = tmp_path / "data"
    make_files(root)
    plain, _ = run(tmp_path, "unlisted", root, as_is=as_is, epochs=1)
    cached, err = run(tmp_path, "unlisted", root, cache="1GiB", epochs=1)
    assert plain["epochs"][0]["samples"] == cached["epochs"][0]["samples"]
    lines = [line for line in err.splitlines() if "cache not applied" in line]
    assert lines == [
        "unstall: cache not applied to Unlisted: Unlisted lists no files (no samples/imgs or "
        "list of paths among its attributes); running uncached"
    ]


def test_a_cached_file_is_read_only_bytes_and_its_fileno_is_the_real_file(tmp_path):
    from unstall.loader.file_hook import CachedFile

    path = tmp_path / "f.bin"
    path.write_bytes(b"0123456789")
    f = CachedFile(b"0123456789", str(path), str(path))
    assert (f.name, f.mode, f.readable(), f.writable(), f.seekable()) == (
        str(path),
        "rb",
        True,
        False,
        True,
    )
    assert f.read(3) == b"012" and f.peek(2) == b"34" and f.tell() == 3
    with pytest.raises(io.UnsupportedOperation):
        f.write(b"x")
    assert os.read(f.fileno(), 2) == b"34"  # the real file, at the same position
    assert f.read() == b"56789" and f.tell() == 10
    f.seek(1)
    assert f.read(2) == b"12"
    f.close()
    assert f.closed


class PathsDataset(torch.utils.data.Dataset):
    """A plain map-style dataset over paths (importable: spawned workers unpickle it)."""

    def __init__(self, paths: list[Path]):
        self.paths = [str(p) for p in paths]

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> bytes:
        with open(self.paths[i], "rb") as f:
            return f.read()


def epochs_of(loader: unstall.DataLoader, epochs: int) -> list[list[bytes]]:
    return [sorted(raw for batch in loader for raw in batch) for _ in range(epochs)]


#: one spawned worker, started again each epoch: the hook installed in a process that inherited
#: nothing (spawned workers sharing one segment: tests/cache/test_sharing.py)
@pytest.mark.parametrize("workers, context", [(0, None), (1, "spawn")])
def test_in_process_without_workers_and_with_spawned_ones(tmp_path, workers, context):
    paths = make_files(tmp_path / "data")
    truth = sorted(p.read_bytes() for p in paths)
    loader = unstall.DataLoader(
        PathsDataset(paths),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        multiprocessing_context=context,
        collate_fn=list,
        cache=unstall.Cache(N // 2 * SIZE),
    )
    assert epochs_of(loader, 2) == [truth, truth]
    first, second = (e["cache"] for e in loader.stats()["per_epoch"])
    assert (first["misses"], first["inserted"]) == (N, N // 2)
    assert (second["hits"], second["misses"]) == (N // 2, N // 2)
    loader.close()
    assert open is file_hook.real_open  # the main process's hook goes with the loader


def test_the_disk_tier_below_the_ram_tier(tmp_path):
    paths = make_files(tmp_path / "data")
    truth = sorted(p.read_bytes() for p in paths)
    cache = unstall.Cache(ram=N // 4 * SIZE, disk=N // 4 * SIZE)
    loader = unstall.DataLoader(
        PathsDataset(paths), batch_size=4, shuffle=True, num_workers=2, collate_fn=list, cache=cache
    )
    assert epochs_of(loader, 2) == [truth, truth]
    second = loader.stats()["per_epoch"][1]["cache"]
    assert (second["ram_hits"], second["disk_hits"], second["misses"]) == (N // 4, N // 4, N // 2)
    cache.check()
    loader.close()


def test_the_hook_serves_only_whole_binary_reads_of_listed_regular_files(tmp_path):
    from unstall.cache.files import bind_files

    paths = make_files(tmp_path / "data")
    other = tmp_path / "other.bin"
    other.write_bytes(b"not listed")
    files = bind_files(unstall.Cache(1 << 20), PathsDataset(paths))
    assert files is not None and files.files == N
    file_hook.install(files)
    try:
        with open(paths[0], "rb") as f:
            assert type(f) is file_hook.CachedFile and f.read() == paths[0].read_bytes()
        with open(os.path.relpath(paths[0]), "rb") as f:  # any spelling of the path
            assert type(f) is file_hook.CachedFile and f.name == os.path.relpath(paths[0])
        real = {
            "unbuffered": ((paths[1], "rb"), {"buffering": 0}),
            "text": ((paths[1],), {"encoding": "latin-1"}),
            "update": ((paths[1], "r+b"), {}),
            "append": ((paths[1], "ab"), {}),
            "not listed": ((other, "rb"), {}),
            "a descriptor": ((os.open(paths[1], os.O_RDONLY), "rb"), {}),
            "/proc": (("/proc/self/status", "rb"), {}),
        }
        with pytest.raises(ValueError, match="binary mode doesn't take an encoding"):
            open(paths[1], "rb", encoding="utf-8")  # noqa: SIM115 (the real open's own error)
        kinds = {}
        for what, (args, kwargs) in real.items():
            with open(*args, **kwargs) as f:
                kinds[what] = type(f).__name__
        assert kinds == {
            "unbuffered": "FileIO",
            "text": "TextIOWrapper",
            "update": "BufferedRandom",
            "append": "BufferedWriter",
            "not listed": "BufferedReader",
            "a descriptor": "BufferedReader",
            "/proc": "BufferedReader",
        }
        files.max_bytes = SIZE - 1  # past the size limit: the real file, untouched
        with open(paths[2], "rb") as f:
            assert type(f) is io.BufferedReader and f.read() == paths[2].read_bytes()
        stats = files.stats()["cache"]
        assert (stats["hits"], stats["misses"], stats["inserted"]) == (2, 1, 1)
    finally:
        file_hook.uninstall(files)
        files.close()
    assert open is file_hook.real_open and io.open is file_hook.real_open


def test_fill_and_drop_page_cache_for_a_cached_run(tmp_path):
    """What the analyzer's cached run needs: chosen files in the cache before timing."""
    from unstall.cache.files import bind_files, drop_page_cache

    paths = make_files(tmp_path / "data")
    files = bind_files(unstall.Cache(N * SIZE), PathsDataset(paths))
    assert files is not None and files.paths == [str(p) for p in paths]
    try:
        assert files.fill(range(0, N, 2)) == N // 2
        assert files.fill(range(0, N, 2)) == 0  # held already: hits
        truth = [p.read_bytes() for p in paths]
        file_hook.install(files)
        drop_page_cache(files.paths)
        served = []
        for p, raw in zip(paths, truth, strict=True):
            with open(p, "rb") as f:
                served.append((type(f) is file_hook.CachedFile, f.read() == raw))
        assert served == [(True, True)] * N
        stats = files.stats()["cache"]
        assert (stats["hits"], stats["misses"], stats["items_cached"]) == (N, N, N)
    finally:
        file_hook.uninstall(files)
        files.close()
