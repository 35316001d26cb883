"""The loader's watchdog (issue 46): a stuck loader ends in `LoaderStuckError`, within its bound,
naming the worker and the batch, with nothing left in /dev/shm or the process table.

Each fault is real: a worker stopped with SIGSTOP, a dataset that blocks in ``__getitem__``,
a batch task lost on its way to its worker (the index queue drops it), a worker that hangs
at start without CPU (its pool restarted at the same batch, `unstall.loader.workers.stuck_start`).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import time

import psutil
import pytest
import torch

from unstall import DataLoader
from unstall.loader.handoff.slots import leftover_slots
from unstall.loader.workers import stuck_start
from unstall.loader.workers.watchdog import LoaderStuckError, bound_s

BOUND = 2.0
#: The error must come within the bound plus this much (a poll, the workers' shutdown).
SLACK = 6.0


class Rows(torch.utils.data.Dataset):
    """64 KiB rows (a batch of 4 fills a zero-copy slot); ``block`` sleeps in ``__getitem__``
    forever, ``delay`` makes each item sleep that long, ``burn`` burns that much CPU."""

    def __init__(self, n: int = 64, block: int | None = None, delay: float = 0.0, burn=0.0):
        self.n, self.block, self.delay, self.burn = n, block, delay, burn

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.block:
            time.sleep(3600)
        if self.delay:
            time.sleep(self.delay)
        end = time.thread_time() + self.burn
        while time.thread_time() < end:
            pass
        return torch.full((16384,), float(i))


def children() -> list[psutil.Process]:
    """This test process's live descendants (zombies reaped or not: not running)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def stuck(it) -> tuple[LoaderStuckError, float]:
    """Pull batches from ``it`` until the watchdog's error; it and how long the last wait was."""
    while True:
        t0 = time.monotonic()
        try:
            next(it)
        except LoaderStuckError as exc:
            return exc, time.monotonic() - t0


@pytest.fixture(autouse=True)
def nothing_left():
    before = {p.pid for p in children()}
    yield
    deadline = time.monotonic() + 5
    while {p.pid for p in children()} - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not {p.pid for p in children()} - before, "workers left running"
    assert leftover_slots() == []


def test_a_worker_stopped_with_sigstop():
    loader = DataLoader(Rows(delay=0.02), batch_size=4, num_workers=2, watchdog_s=BOUND)
    it = iter(loader)
    raw = it._torch_iter
    stopped = raw._workers[0].pid
    os.kill(stopped, signal.SIGSTOP)
    exc, waited = stuck(it)
    assert waited < BOUND + SLACK
    msg = str(exc)
    assert f"worker 0: pid {stopped}, stopped" in msg, msg
    # the loop waits for task 0, which torch gave worker 0: indices 0-3
    assert "waited" in msg and "for batch task 0 " in msg
    assert "task 0: worker 0, dataset indices [0, 1, 2, 3]" in msg
    assert exc.state["workers"][0]["state"] == "stopped"
    assert not psutil.pid_exists(stopped) or psutil.Process(stopped).status() == "zombie"
    with pytest.raises(StopIteration):  # the failed epoch ends there
        next(it)


def test_a_dataset_that_blocks_forever_in_getitem():
    loader = DataLoader(Rows(block=21), batch_size=4, num_workers=2, watchdog_s=BOUND)
    it = iter(loader)
    pids = [w.pid for w in it._torch_iter._workers]
    exc, waited = stuck(it)
    assert waited < BOUND + SLACK
    msg = str(exc)
    # index 21 is in task 5 (indices 20-23), the third task of worker 1
    assert "task 5: worker 1, dataset indices [20, 21, 22, 23]" in msg, msg
    assert f"worker 1: pid {pids[1]}, sleeping" in msg and "on task 5" in msg
    assert exc.state["waiting_for"] == 5


def test_a_lost_batch_task():
    loader = DataLoader(Rows(), batch_size=4, num_workers=2, watchdog_s=BOUND)
    it = iter(loader)
    first = next(it)
    assert first[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    raw = it._torch_iter
    lost = raw._send_idx  # the task put after this batch: dropped on its way to its worker
    queue = raw._index_queues[lost % 2]
    put = queue.put
    queue.put = lambda obj, *a, **k: None if obj and obj[0] == lost else put(obj, *a, **k)
    exc, waited = stuck(it)
    assert waited < BOUND + SLACK
    msg = str(exc)
    indices = list(range(4 * lost, 4 * lost + 4))
    assert f"task {lost}: worker {lost % 2}, dataset indices {indices}" in msg, msg
    assert f"worker {lost % 2}: pid" in msg and f"on task {lost}" in msg


def test_progress_keeps_a_slow_loader_going():
    """A worker that keeps working (each batch longer than the bound) is never stopped."""
    loader = DataLoader(Rows(n=4, burn=0.3), batch_size=2, num_workers=1, watchdog_s=0.3)
    got = [int(x) for b in loader for x in b[:, 0]]
    assert got == list(range(4))


def test_the_bound_from_the_environment(monkeypatch):
    loader = DataLoader(Rows(n=4), batch_size=4)
    monkeypatch.setenv("UNSTALL_WATCHDOG_S", "7")
    assert bound_s(loader) == 7.0
    monkeypatch.delenv("UNSTALL_WATCHDOG_S")
    assert bound_s(loader) == 300.0
    assert bound_s(DataLoader(Rows(n=4), batch_size=4, watchdog_s=0)) == 0.0
    with pytest.raises(ValueError, match="watchdog_s"):
        bound_s(DataLoader(Rows(n=4), batch_size=4, watchdog_s=-1))


def test_persistent_workers_start_afresh_after_the_error():
    loader = DataLoader(
        Rows(n=16, block=5), batch_size=4, num_workers=2, persistent_workers=True, watchdog_s=BOUND
    )
    with pytest.raises(LoaderStuckError, match=r"task 1: worker 1, dataset indices \[4, 5, 6, 7\]"):
        list(loader)
    loader.dataset.block = None  # the next epoch's new workers find the dataset unblocked
    assert [int(x) for b in loader for x in b[:, 0]] == list(range(16))
    loader._inner._iterator._shutdown_workers()  # persistent: stopped here, not at exit
    loader.close()  # its slots (the failed epoch's were unlinked when it failed)


def hang_at_start(marker: str | None, worker_id: int, hung: int = 0) -> None:
    """Worker ``hung``'s init blocks without CPU: in the first pool only (``marker``, made
    by the first such worker started), or in every pool (``marker`` None)."""
    if worker_id != hung:
        return
    if marker is not None:
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return  # a restarted pool's worker runs normally
    r, _ = os.pipe()
    os.read(r, 1)  # never written: sleeps, no CPU, no task done


@pytest.mark.parametrize("hung", [0, 1])
def test_a_worker_stuck_at_start_restarts_the_pool(hung, tmp_path, monkeypatch, caplog):
    """Worker ``hung`` never starts: the loop waits for batch ``hung`` (its first task)."""
    monkeypatch.setattr(stuck_start, "START_S", 1.0)
    hang = functools.partial(hang_at_start, str(tmp_path / "first"), hung=hung)
    loader = DataLoader(
        Rows(n=32),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        seed=0,
        worker_init_fn=hang,
        watchdog_s=60,
    )
    order = list(DataLoader(range(32), batch_size=4, shuffle=True, seed=0))  # no workers
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="unstall"):
        it = iter(loader)
        pid = it._torch_iter._workers[hung].pid
        got = [int(x) for b in it for x in b[:, 0]]
    assert time.monotonic() - t0 < 20  # the watchdog's bound is 60 s
    assert got == [int(x) for b in order for x in b]  # every sample once, in the seed's order
    lines = [r.getMessage() for r in caplog.records if "stuck at start" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"worker {hung} (pid {pid}) stuck at start" in lines[0]
    assert f"at batch {hung} of epoch 0" in lines[0]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"


def test_past_its_restarts_the_bound_stands(monkeypatch, caplog):
    monkeypatch.setattr(stuck_start, "START_S", 0.5)
    hang = functools.partial(hang_at_start, None)  # every pool's worker 0 hangs
    loader = DataLoader(Rows(n=16), batch_size=4, num_workers=2, worker_init_fn=hang, watchdog_s=2)
    with (
        caplog.at_level(logging.WARNING, logger="unstall"),
        pytest.raises(LoaderStuckError, match=r"worker 0: pid \d+, sleeping"),
    ):
        list(loader)
    lines = [r.getMessage() for r in caplog.records if "stuck at start" in r.getMessage()]
    assert len(lines) == stuck_start.RESTARTS, lines
