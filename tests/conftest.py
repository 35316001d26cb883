"""Fixtures shared by every test folder: tiny datasets and the one resume helper."""

from __future__ import annotations

import gc
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: One intra-op thread for torch in the tests and every process they start (scripts, ranks,
#: benches): the suite runs three tests at once on two cores, and two processes each spinning
#: OpenMP threads on both cores make a tiny ResNet step take seconds instead of a tenth
#: (5 s against 0.5 s measured here). Set before torch is imported; a test may still set its own.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest
import torch

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
#: torch's ~200k import-time objects out of the collector's way: a full collection (the cache
#: tests run one after each test to finalize what it dropped, loaders' teardown runs more)
#: walks only the objects the tests made, 0.3-0.5 s less each. Nothing frozen here is garbage.
#: Frozen again once the tests are collected (`pytest_collection_finish`).
gc.freeze()

#: Tests that measure time or rates: the ``timed`` marker. Each needs a core to itself, not
#: the machine: they run one per core, each xdist worker pinned to a core of its own with all it
#: starts (``--core-per-worker``), a file's tests on one worker in order (``--dist loadfile``),
#: after the rest, which run on three processes (README, `.ci/run`). A pinned test sees a
#: one-core machine (unstall counts cores and their load by the process's affinity,
#: `unstall.machine`), and its core is not shared with the other stream.
TIMED = (
    "tests/analysis/",
    "tests/bench/test_harness.py",
    "tests/bench/test_filecache.py",
    "tests/models/test_simulated.py",
    # a Ray cluster of 3 nodes, shared by the module's tests in order (`--dist loadfile`: one
    # worker): beside the parallel half its load made a peer request time out
    # (tests/distributed read an item twice)
    "tests/remote/test_ray.py",
    "tests/cache/test_bench.py",
    "tests/cache/test_lookup_cost.py",
    "tests/cache/test_lifecycle.py",
    "tests/coordination/test_group.py",
    "tests/data/shards/test_together.py",
    "tests/distributed/test_tls.py",
    "tests/gpu/test_hybrid.py",
    # the tuner reads its cores' load; its tests check that no autotune share file is left in
    # /dev/shm, which no other timed test makes (they need a torchrun job or a job key)
    "tests/loader/test_autotune.py",
    "tests/loader/test_iterator_stats.py",
    "tests/loader/test_torch_parity.py",
    "tests/stores/test_throttle.py",
)

#: Tests in the `TIMED` paths that time nothing and look only at their own shared-memory
#: files and processes (structure, exact counts): they run in the parallel half.
UNTIMED = (
    # the pair runner's order and ratios, on callables that return set rates
    "tests/bench/test_harness.py::test_pair",
    "tests/bench/test_harness.py::test_three_sides_rotate",
    # which loader the frameworks' runs measure, their ranks and batch counts: no rate
    "tests/analysis/test_frameworks.py::",
    # the cache's exact hits and items under `unstall run --config`
    "tests/analysis/test_file_cache.py::test_unstall_run_json_shows_the_file_cache_per_loader",
    "tests/analysis/test_headline.py::",
    # script mode's runs started, stopped, hung and timed out: structure and their own
    # processes and shared-memory folder (`own_shm_dir`), no rate
    "tests/analysis/test_script.py::",
    "tests/analysis/test_slow_run.py::",
    "tests/analysis/test_timeline.py::",
    "tests/analysis/test_verify.py::",
)

#: Tests that need the whole machine: every core (their figures hold for two cores, not one),
#: or all of /dev/shm (a file another test makes beside them would show): the ``alone``
#: marker, run by themselves last.
ALONE = (
    # the `auto` recommendation re-run and held to 15 % of its price: on one core its price
    # came out 13-26 % optimistic (210 priced, 172 re-run: the autotuner's walk on one core,
    # not priced yet), within 15 % on two. (The file cache's verified recommendations were
    # 16-26 % optimistic on one core too, until the model priced the loop's wait for a core:
    # 4.5-9.5 % since, `unstall.analysis.model.predict.loop_cap`; they are timed tests now.)
    "tests/analysis/test_imagenet_example.py::",
    # every file of /dev/shm before and after
    "tests/gpu/test_hybrid.py::test_shutdown_leaves_no_thread_process_or_shared_memory",
)


#: Files whose tests take longest (15-50 s each on two cores: whole training scripts, the
#: frameworks', benches, the Ray cluster): first in the order, so xdist hands them out at the
#: start and each worker's last minutes are short tests (in order of collection, the parallel
#: half's three workers ended at 314, 322 and 331 s, the last after a 30 s Lightning test).
#: A file's tests keep their order. The benches' example-script runs (cache points, detection,
#: audio) and the audio and detection scripts under `unstall run` are among them: 30-80 s each.
SLOW_FIRST = (
    "tests/bench/test_launch.py",
    "tests/bench/test_cachepoints.py",
    "tests/bench/test_detection.py",
    "tests/bench/test_audio.py",
    "tests/adapt/detection/test_detection_script.py",
    "tests/launch/test_audio_m5.py",
    "tests/launch/test_frameworks.py",
    "tests/analysis/test_frameworks.py",
    "tests/bench/test_autotune.py",
    "tests/launch/test_torchvision.py",
    "tests/loader/test_order.py",
    "tests/remote/test_ray.py",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--core-per-worker",
        action="store_true",
        help="pin each xdist worker, and every process it starts, to a core of its own "
        "(the timed tests: one per core)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Under ``--core-per-worker``, xdist worker gwN takes the Nth core this process may use."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not (config.getoption("core_per_worker") and worker.startswith("gw")):
        return
    cores = sorted(os.sched_getaffinity(0))
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if count > len(cores):
        raise pytest.UsageError(
            f"--core-per-worker: {count} workers on {len(cores)} cores: use -n {len(cores)}"
        )
    core = {cores[int(worker[2:])]}
    for tid in os.listdir("/proc/self/task"):  # every thread: each has its own affinity
        os.sched_setaffinity(int(tid), core)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under ``-m timed`` or ``-m alone`` (the suite's second and third runs), a test file that
    can hold no such test is not imported: its path is not listed and it does not name the
    marker itself. ~3 s less collection a run (torchvision's import is 1.75 s of it)."""
    marker = config.getoption("markexpr", "")
    name = collection_path.name
    if marker not in ("timed", "alone") or not (name.startswith("test_") and name.endswith(".py")):
        return None
    listed = TIMED if marker == "timed" else tuple(t.split("::")[0] for t in ALONE)
    path = collection_path.relative_to(config.rootpath).as_posix()
    if path.startswith(listed) or f"mark.{marker}" in collection_path.read_text():
        return None
    return True


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the `TIMED` tests (by path, so a new test in a timing folder is timed too), less
    the `UNTIMED` ones (by test id), and the `ALONE` ones (by test id); the `SLOW_FIRST`
    files' tests first."""
    root = Path(str(config.rootpath))

    def path_of(item: pytest.Item) -> str:
        return Path(str(item.path)).relative_to(root).as_posix()

    items.sort(key=lambda item: not path_of(item).startswith(SLOW_FIRST))  # stable
    for item in items:
        path = path_of(item)
        test_id = path + "::" + item.nodeid.split("::", 1)[-1]
        if test_id.startswith(ALONE):
            item.add_marker(pytest.mark.alone)
        elif path.startswith(TIMED) and not test_id.startswith(UNTIMED):
            item.add_marker(pytest.mark.timed)


def pytest_collection_finish(session: pytest.Session) -> None:
    """What the test modules imported (torchvision alone is ~150k objects, PIL, numpy, unstall)
    frozen too, after a collection of what collecting left as garbage: each full collection in
    a test or fixture (the cache tests' teardown runs one per test) took 170 ms walking them,
    ~0 ms frozen. Objects the tests make stay collectable: the reference-cycle tests see them."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):
    """A failed test on a disk with too little room for the default local-disk tier says so
    beside its failure: the tier then rightly keeps nothing ("coalesced range GETs", no shard
    copies), and the shards' and S3 datasets' tests of it fail for want of room, not a bug."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    from unstall.cache import disk_files
    from unstall.machine import cache_dir

    if disk_files.auto_disk_bytes(64 << 20) < 64 << 20:  # the tier's own room, at cache_dir
        directory = cache_dir()
        free = disk_files.free_bytes(directory)
        report.sections.append(
            (
                "unstall: short of disk",
                f"{free / 2**30:.1f} GiB free on the disk of {directory}: the default disk "
                f"tier leaves {disk_files.KEEP_FREE / 2**30:.0f} GiB free, so it keeps no "
                "copy, and tests of the disk tier fail. Free some disk and run them again.",
            )
        )


@pytest.fixture(autouse=True)
def unstall_cache_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Disk caches (on by default for s3:// datasets) go to a temporary dir, never ~/.cache."""
    path = tmp_path_factory.mktemp("unstall-cache")
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(path))
    return path


@pytest.fixture(autouse=True)
def no_kept_segments(monkeypatch: pytest.MonkeyPatch):
    """RAM segments are removed when their last user leaves (tests check /dev/shm is clean);
    tests of kept segments set ``UNSTALL_CACHE_KEEP_S`` or ``Cache(keep=...)`` themselves."""
    monkeypatch.setenv("UNSTALL_CACHE_KEEP_S", "0")


class IdDataset(torch.utils.data.Dataset):
    """Sample i is the integer i: batches show exactly which samples were loaded."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> int:
        if not 0 <= index < self.n:
            raise IndexError(index)
        return index


def write_jpegs(root: Path, n: int, *, classes: int, seed: int) -> Path:
    """``n`` synthetic JPEGs under ``root/c<class>/<i>.jpg`` (class ``i % classes``)."""
    from unstall.data.synthetic import render_image

    for i in range(n):
        path = root / f"c{i % classes}" / f"{i:03d}.jpg"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(render_image(seed, i, classes=classes))
    return root


def flatten_ids(batches: list[Any]) -> list[int]:
    """All sample ids of a sequence of collated batches, in order."""
    out: list[int] = []
    for batch in batches:
        out.extend(batch.tolist() if isinstance(batch, torch.Tensor) else list(batch))
    return out


def check_resume(make_loader: Callable[[], Any], *, epochs: int = 2) -> None:
    """Stop at several midpoints, save, rebuild, resume; the rest must match exactly.

    The reference is an uninterrupted run of ``epochs`` epochs. For each cut
    point (0, one batch, mid-epoch, end of epoch, inside the next epoch) a fresh
    loader runs to the cut, saves `state_dict`, a new loader loads it and runs to
    the end; the concatenation must equal the reference, batch for batch.
    """
    reference: list[list[int]] = []
    loader = make_loader()
    for _ in range(epochs):
        reference.extend(b.tolist() for b in loader)
    per_epoch = len(reference) // epochs
    cuts = sorted({0, 1, per_epoch // 2, per_epoch, per_epoch + per_epoch // 2})
    for cut in cuts:
        first = make_loader()
        got: list[list[int]] = []
        epoch_iter = iter(first)
        while len(got) < cut:
            batch = next(epoch_iter, None)
            if batch is None:  # epoch boundary: start the next one
                epoch_iter = iter(first)
                continue
            got.append(batch.tolist())
        state = first.state_dict()
        del epoch_iter, first
        second = make_loader()
        second.load_state_dict(state)
        while len(got) < len(reference):
            before = len(got)
            got.extend(b.tolist() for b in second)
            assert len(got) > before, f"resume from cut {cut} made no progress: {state}"
        assert got == reference, f"resume from cut {cut} (state {state}) diverged"


@pytest.fixture
def id_dataset() -> Callable[[int], IdDataset]:
    return IdDataset


@pytest.fixture
def resume_checker() -> Callable[..., None]:
    return check_resume
