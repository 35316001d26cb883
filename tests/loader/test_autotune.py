"""``num_workers="auto"``: pool changes mid-epoch lose and repeat nothing, draws stay the
same, resume works after a change, a killed worker leaves nothing behind; the rule itself
on synthetic measurements."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
import torch

import unstall
from unstall.loader.autotune import Budget, Window, decide, resources
from unstall.loader.autotune.controller import START_WORKERS
from unstall.loader.autotune.resources import cores_left, memory_ceiling
from unstall.loader.autotune.share import SHARE_PREFIX, NodeShare
from unstall.loader.handoff import leftover_slots
from unstall.loader.handoff.slots import slot_dir

SIDE = 128  # 3 x 128 x 128 uint8 a sample: batches of 8 go through zero-copy slots


class Drawn(torch.utils.data.Dataset):
    """Sample i: an image holding i, its id, and a random draw (seeded per batch by unstall)."""

    def __init__(self, n: int = 96):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = torch.full((3, SIDE, SIDE), i % 251, dtype=torch.uint8)
        x[0, 0, 0], x[0, 0, 1] = i // 256, i % 256
        return x, i, torch.rand(())


def _ids(x: torch.Tensor, y: torch.Tensor) -> list[int]:
    assert (x[:, 0, 0, 0].long() * 256 + x[:, 0, 0, 1].long()).tolist() == y.tolist()
    return y.tolist()


def _run(loader, epochs: int = 2) -> list[tuple[list[int], list[float]]]:
    out = []
    for _ in range(epochs):
        for x, y, r in loader:
            out.append((_ids(x, y), r.tolist()))
    return out


@pytest.fixture(autouse=True)
def _clean_shm():
    gc.collect()
    assert leftover_slots() == []
    yield
    gc.collect()
    assert leftover_slots() == []
    assert not [n for n in os.listdir(slot_dir()) if n.startswith(SHARE_PREFIX)]


@pytest.mark.parametrize("persistent", [False, True])
def test_pool_changes_mid_epoch_give_every_sample_once_with_the_same_draws(persistent):
    reference = unstall.DataLoader(
        Drawn(), batch_size=8, shuffle=True, seed=7, num_workers=2, persistent_workers=persistent
    )
    expected = _run(reference)
    reference.close()
    loader = unstall.DataLoader(
        Drawn(), batch_size=8, shuffle=True, seed=7, num_workers="auto",
        persistent_workers=persistent,
    )  # fmt: skip
    tuner = loader._autotune
    tuner.schedule([(3, 3), (6, 2), (9, 1)])  # batch numbers of epoch 0
    seen_workers = []
    got = []
    for epoch in range(2):
        for x, y, r in loader:
            got.append((_ids(x, y), r.tolist()))
            seen_workers.append(len(tuner.raw._workers))
            current = set(leftover_slots())  # this process's slots (other tests make theirs)
            assert len(current) <= tuner.prefetch * tuner.workers + 4  # old pools unlinked
        if epoch == 0:
            assert sorted(i for ids, _ in got for i in ids) == list(range(96))
    assert got == expected  # same batches, same order, same random draws
    start = min(START_WORKERS, len(os.sched_getaffinity(0)))  # 1: the 1 -> 3 -> 2 -> 1
    assert seen_workers[:12] == [start] * 3 + [3, 3, 3, 2, 2, 2, 1, 1, 1]
    stats = loader.stats()["autotune"]
    assert [h["num_workers"] for h in stats["history"]] == [[start, 3], [3, 2], [2, 1]]
    assert [h["batch"] for h in stats["history"]] == [3, 6, 9]
    assert stats["num_workers"] == 1 and loader.num_workers == 1
    assert loader.stats()["zero_copy"]["slot_batches"] > 0
    loader.close()


def test_resume_after_a_pool_change():
    reference = unstall.DataLoader(Drawn(), batch_size=8, shuffle=True, seed=3, num_workers=1)
    expected = _run(reference)
    first = unstall.DataLoader(Drawn(), batch_size=8, shuffle=True, seed=3, num_workers="auto")
    first._autotune.schedule([(2, 3)])
    it = iter(first)
    got = []
    for _ in range(5):
        x, y, r = next(it)
        got.append((_ids(x, y), r.tolist()))
    assert first._autotune.workers == 3
    state = json.loads(json.dumps(first.state_dict()))
    assert state["batches_done"] == 5
    del it
    first.close()
    second = unstall.DataLoader(Drawn(), batch_size=8, shuffle=True, seed=3, num_workers="auto")
    second._autotune.schedule([(7, 2)])
    second.load_state_dict(state)
    got += _run(second, 1)
    got += _run(second, 1)
    assert got == expected
    second.close()


def test_worker_killed_while_the_pool_grows_leaves_nothing_behind():
    before = {c.pid for c in psutil.Process().children()}
    loader = unstall.DataLoader(Drawn(400), batch_size=8, seed=1, num_workers="auto", timeout=20)
    tuner = loader._autotune
    tuner.schedule([(2, 3)])
    it = iter(loader)
    for _ in range(3):  # the third pull starts the pool of 3
        _ids(*next(it)[:2])
    workers = [w.pid for w in tuner.raw._workers]
    assert len(workers) == 3
    os.kill(workers[1], signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"(?i)worker"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            next(it)
    assert leftover_slots() == []
    del it
    loader.close()
    del loader, tuner
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        alive = [c for c in psutil.Process().children() if c.pid not in before]
        if not [c for c in alive if c.status() != psutil.STATUS_ZOMBIE]:
            break
        time.sleep(0.1)
    assert [c.pid for c in alive if c.status() != psutil.STATUS_ZOMBIE] == []


def test_device_stage_and_pin_memory_keep_working_across_changes():
    expected = [ids for ids, _ in _run(unstall.DataLoader(Drawn(64), batch_size=8, seed=2), 1)]
    for kwargs in ({"device": "cpu"}, {"pin_memory": True}):
        loader = unstall.DataLoader(Drawn(64), batch_size=8, seed=2, num_workers="auto", **kwargs)
        loader._autotune.schedule([(1, 3), (4, 1)])
        got = [_ids(x, y) for x, y, _ in loader]
        assert got == expected, kwargs
        assert loader.stats()["autotune"]["changes"] == 2
        loader.close()


def test_config_file_sets_auto(tmp_path, monkeypatch):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"kwargs": {"num_workers": "auto", "prefetch_factor": "auto"}}))
    monkeypatch.setenv("UNSTALL_CONFIG", str(path))
    loader = unstall.DataLoader(Drawn(32), batch_size=8, seed=0, num_workers=4)
    assert loader.stats()["autotune"]["tuning"] == ["num_workers", "prefetch_factor"]
    assert sorted(i for x, y, _ in loader for i in _ids(x, y)) == list(range(32))
    loader.close()


def test_an_int_pins_the_setting():
    loader = unstall.DataLoader(Drawn(16), batch_size=8, num_workers=2)
    assert "autotune" not in loader.stats()
    assert loader.num_workers == 2 and loader._autotune is None
    with pytest.raises(ValueError, match="'auto'"):
        unstall.DataLoader(Drawn(16), batch_size=8, num_workers="auto", prefetch_factor="4")


class Slow(torch.utils.data.Dataset):
    """Each sample takes 15 ms of waiting (I/O-like: no core used)."""

    def __len__(self) -> int:
        return 240

    def __getitem__(self, i: int) -> int:
        time.sleep(0.015)
        return i


def test_the_rule_grows_a_waiting_loop_on_its_own(monkeypatch):
    monkeypatch.setattr(resources, "node_cores", lambda: 4)  # sleeping workers: room for 4
    monkeypatch.setattr(resources.IdleMeter, "idle_cores", lambda self: 4.0)  # a quiet node
    loader = unstall.DataLoader(Slow(), batch_size=4, seed=0, num_workers="auto")
    got = [i for b in loader for i in b.tolist()]
    assert sorted(got) == list(range(240))
    stats = loader.stats()["autotune"]
    assert stats["history"], stats
    first = stats["history"][0]
    assert first["num_workers"][0] == START_WORKERS and first["num_workers"][1] > 2
    assert first["why"] == "loop waits, cores free"
    assert stats["num_workers"] <= 2 * stats["cores"] == 8  # sleeping workers: I/O-bound
    loader.close()


# The rule on synthetic measurements -------------------------------------------------


def _window(workers, *, wait=0.0, util=1.0, runq=0.0, batches=20, wall=1.0, prefetch=2, cpu=1.0):
    busy = util * wall * workers
    return Window(batches, wall, wait * wall, busy, cpu * busy, runq * busy, workers, prefetch)


def test_rule_grows_when_the_loop_waits_and_cores_are_free():
    d = decide(_window(1, wait=0.6), Budget(cores=8))
    assert d is not None and d.workers > 1 and d.why == "loop waits, cores free"
    # the loop takes 0.4 s of 1 s over 20 batches (20 ms each); a task takes 50 ms: 3 workers
    assert d.workers == 3


def test_rule_never_goes_above_the_core_budget_or_the_memory_ceiling():
    assert decide(_window(1, wait=0.9), Budget(cores=2)).workers == 2
    assert decide(_window(2, wait=0.9), Budget(cores=2)) is None
    assert decide(_window(2, wait=0.9), Budget(cores=8, memory_workers=2)) is None
    d = decide(_window(4, wait=0.9), Budget(cores=8, memory_workers=3))
    assert d.workers == 3 and "memory" in d.why
    d = decide(_window(4, wait=0.0), Budget(cores=2))
    assert d.workers == 2 and "cores" in d.why
    # crowded cores (workers wait for one more than half their task time): no growth
    assert decide(_window(2, wait=0.5, runq=0.6), Budget(cores=8)) is None


def test_rule_grows_only_into_idle_cores():
    assert decide(_window(2, wait=0.9), Budget(cores=8, idle=0.3)) is None  # node busy
    assert decide(_window(2, wait=0.9), Budget(cores=8, idle=1.2)).workers == 3
    assert decide(_window(2, wait=0.9, cpu=0.5), Budget(cores=8, idle=1.2)).workers == 4


def test_workers_waiting_on_io_count_as_part_of_a_core():
    # a quarter of each task on the CPU: two workers per free core at most
    d = decide(_window(2, wait=0.9, cpu=0.25), Budget(cores=2))
    assert d.workers == 4
    assert decide(_window(4, wait=0.9, cpu=0.25), Budget(cores=2)) is None
    # CPU-bound again: back to one worker per core
    assert decide(_window(4, wait=0.0, cpu=1.0), Budget(cores=2)).workers == 2


def test_rule_shrinks_idle_workers_and_settles():
    d = decide(_window(4, wait=0.0, util=0.1), Budget(cores=8))
    assert d.workers == 1 and d.why == "workers idle"
    assert decide(_window(4, wait=0.0, util=0.1), Budget(cores=8), floor=3).workers == 3
    assert decide(_window(2, wait=0.0, util=0.9), Budget(cores=8)) is None  # busy: keep
    assert decide(_window(3, wait=0.08, util=0.2), Budget(cores=8)).workers > 3  # it waits


def test_rule_raises_prefetch_when_the_loop_waits_on_idle_workers():
    w = _window(2, wait=0.3, util=0.4)
    d = decide(w, Budget(cores=2), tune_workers=False, tune_prefetch=True)
    assert (d.workers, d.prefetch) == (2, 4)


def test_rule_raises_requests_in_flight_when_they_queue_and_the_pool_cannot_grow():
    io = _window(4, wait=0.9, cpu=0.2)  # fetch-bound: a fifth of each task on the CPU
    d = decide(io, Budget(cores=2, idle=1.0), inflight=16, queued=True)
    assert (d.workers, d.inflight, d.why) == (4, 32, "loop waits on requests")
    assert decide(io, Budget(cores=2, idle=1.0), inflight=16, queued=False) is None  # not bound
    assert decide(io, Budget(cores=2, idle=0.2), inflight=16, queued=True) is None  # no CPU
    assert decide(io, Budget(cores=2), inflight=16, queued=True, inflight_ceiling=16) is None
    # room for workers: they come first, the requests in flight stay
    d = decide(_window(1, wait=0.9, cpu=0.2), Budget(cores=2, idle=1.0), inflight=16, queued=True)
    assert d.workers == 4 and d.inflight == 16 and d.why == "loop waits, cores free"
    # I/O-bound workers that never wait for a core grow on a busy node; CPU-bound ones do not
    assert decide(_window(1, wait=0.9, cpu=0.2), Budget(cores=2, idle=0.1)).workers == 4
    assert decide(_window(1, wait=0.9, cpu=1.0), Budget(cores=2, idle=0.1)) is None


def test_memory_ceiling_from_per_worker_memory():
    gib = 1 << 30
    assert memory_ceiling(2, per_worker=1 * gib, available=4 * gib) == 4
    assert memory_ceiling(2, per_worker=None, available=4 * gib) >= 1 << 16


def test_two_ranks_on_one_node_share_the_cores(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSTALL_SHM_DIR", str(tmp_path))
    monkeypatch.setenv("UNSTALL_AUTOTUNE_JOB", "job-a")
    one, two = NodeShare("job-a"), NodeShare("job-a")
    two.pid = os.getppid()  # another live process stands for the second rank
    first = one.claim(3, waiting=False)
    assert first.workers == 0
    seen = two.claim(1, waiting=True)
    assert (seen.workers, seen.ranks) == (3, 1)
    # rank two: 4 cores less rank one's 3 workers
    assert cores_left(4, 0, seen.workers, seen.ranks, seen.waiting) == 1
    # rank one, while rank two waits: its fair half
    mine = one.claim(3, waiting=False)
    assert cores_left(4, 0, mine.workers, mine.ranks, mine.waiting) == 2
    one.leave()
    two.leave()
    assert list(tmp_path.iterdir()) == []


def test_unstall_run_config_applies_auto_to_an_unchanged_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(
        "import json, torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class D(Dataset):\n"
        "    def __len__(self): return 40\n"
        "    def __getitem__(self, i): return i\n"
        "loader = DataLoader(D(), batch_size=4, shuffle=True, num_workers=3)\n"
        "ids = sorted(int(i) for b in loader for i in b)\n"
        "auto = loader.stats()['autotune']\n"
        "print(json.dumps({'ok': ids == list(range(40)), 'tuning': auto['tuning'],\n"
        "                  'workers': loader.num_workers}))\n"
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"kwargs": {"num_workers": "auto"}}))
    out = tmp_path / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "unstall", "run", "--json", str(out), "--config", str(config),
         "--", sys.executable, str(script)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["ok"] and got["tuning"] == ["num_workers"]
    (proc,) = json.loads(out.read_text())["processes"]
    assert proc["loaders"][0]["num_workers"] == got["workers"]  # what auto settled on
