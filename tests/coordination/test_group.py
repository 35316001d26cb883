"""Coordinated loaders as separate processes: exact batches, each prepared once, faults."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import unstall
from tests import forked
from unstall.coordination import GroupMismatch, group_dir

from .member import Counted, solo

N, EPOCHS, PER_EPOCH = 48, 3, 12
HERE = Path(__file__).resolve().parents[2]


def _shm_leftovers(name: str) -> list[str]:
    d = os.path.dirname(group_dir(name))
    return [n for n in os.listdir(d) if os.path.basename(group_dir(name)) in n]


_STARTED: list[forked.Forked] = []
#: The module's fork server: members start forked from it (`tests.forked`), not as fresh
#: interpreters that each import torch (seconds of CPU each on 2 cores).
_SERVER: list = []


@pytest.fixture(scope="module", autouse=True)
def _fork_server():
    with forked.server((*forked.PRELOAD, "tests.coordination.member")) as ctx:
        _SERVER.append(ctx)
        yield
        _SERVER.clear()


@pytest.fixture(autouse=True)
def _no_member_left():
    """A failed test leaves no member process (and its group) behind for the next one."""
    yield
    killed = set()
    while _STARTED:
        p = _STARTED.pop()
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.wait(timeout=30)
            killed.add(p.args[3])  # its group: nobody left to remove it
    for group in killed:
        shutil.rmtree(group_dir(group), ignore_errors=True)


def _finish(p: forked.Forked, timeout: float, want: int | None = 0) -> bool:
    """Wait for member ``p`` (draining its pipes, so a chatty one cannot block); check its
    exit status is ``want`` (None: any), with its output in the message."""
    out, err = p.communicate(timeout=timeout)
    assert want is None or p.returncode == want, (p.returncode, (out + err).decode()[-3000:])
    return True


#: Seconds for every member to start (python, torch, its loader and workers): 25 s were
#: seen on a loaded 2-core machine, before any batch. Not part of what the tests measure.
START_S = 120


def _started(tmp: Path, procs: list[forked.Forked]) -> None:
    """Wait until every member has made its loader (its file in the barrier directory)."""
    deadline = time.monotonic() + START_S
    while len(os.listdir(tmp / "barrier")) < len(procs):
        for p in procs:
            if p.poll() not in (None, 0) and not (tmp / "barrier" / str(p.pid)).exists():
                _finish(p, 10)  # failed before its loader was made: its output in the message
        assert time.monotonic() < deadline, f"members did not start within {START_S} s"
        time.sleep(0.01)


def _stop_after(tmp: Path, procs: list[forked.Forked], j: int, *, batches: int) -> None:
    """SIGSTOP member ``j`` once it has trained on ``batches`` batches (within 30 s of every
    member having started)."""
    _started(tmp, procs)
    progress = tmp / f"m{j}.progress"
    deadline = time.monotonic() + 30
    while True:  # one read per look: the member truncates the file before each write
        text = progress.read_text() if progress.exists() else ""
        if text.strip().isdigit() and int(text) >= batches:
            break
        assert time.monotonic() < deadline, f"member {j} did not reach batch {batches}"
        time.sleep(0.01)
    os.kill(procs[j].pid, signal.SIGSTOP)


def _start(tmp: Path, group: str, k: int, epochs: int = EPOCHS, env_each=None):
    barrier = tmp / "barrier"
    barrier.mkdir(exist_ok=True)
    procs = []
    for j in range(k):
        env = dict(os.environ, PYTHONPATH=str(HERE), **(env_each(j) if env_each else {}))
        argv = ["-m", "tests.coordination.member", group, str(tmp / f"m{j}"), str(epochs)]
        argv += [str(barrier), str(k)]
        procs.append(forked.Forked(_SERVER[0], argv, env=env, cwd=HERE, output=tmp / f"m{j}"))
    _STARTED.extend(procs)
    return procs


def _result(tmp: Path, j: int):
    return torch.load(tmp / f"m{j}", weights_only=False)


def _prepare_count(tmp: Path, k: int) -> int:
    return sum(
        len((tmp / f"m{j}.log").read_text().split())
        for j in range(k)
        if (tmp / f"m{j}.log").exists()
    )


def _same(seen, expected) -> None:
    assert len(seen) == len(expected)
    for (x, y), (ex, ey) in zip(seen, expected, strict=True):
        assert torch.equal(x, ex) and torch.equal(y, ey)


@pytest.fixture(scope="module")
def expected():
    return solo(N, EPOCHS)


def test_three_members_see_solo_batches_each_prepared_once(tmp_path, expected):
    group = f"t-ok-{os.getpid()}"
    procs = _start(tmp_path, group, 3)
    for p in procs:
        _finish(p, 90)
    stats = []
    for j in range(3):
        r = _result(tmp_path, j)
        assert r["status"] == "ok"
        _same(r["seen"], expected)
        stats.append(r["stats"])
    assert _prepare_count(tmp_path, 3) == N * EPOCHS  # once per sample per epoch, not 3x
    prepared = sum(s["prepared_for_group"] for s in stats)
    assert prepared == PER_EPOCH * EPOCHS
    assert all(s["prepared_privately"] == 0 and s["detached"] == [] for s in stats)
    assert _shm_leftovers(group) == []


def test_sigkilled_member_blocks_nobody_and_shm_is_clean(tmp_path, expected):
    group = f"t-kill-{os.getpid()}"
    procs = _start(
        tmp_path, group, 3, env_each=lambda j: {"MEMBER_SUICIDE_AFTER": "5"} if j == 2 else {}
    )
    _started(tmp_path, procs)
    t0 = time.monotonic()
    for p in procs[:2]:
        _finish(p, 60)
    _finish(procs[2], 10, -signal.SIGKILL)
    assert time.monotonic() - t0 < 60
    for j in range(2):
        _same(_result(tmp_path, j)["seen"], expected)
    deadline = time.monotonic() + 10  # the killed member's workers notice their parent is gone
    while _shm_leftovers(group) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _shm_leftovers(group) == []


def test_sigstopped_member_is_detached_then_finishes_exactly(tmp_path, expected):
    group = f"t-stop-{os.getpid()}"
    env = {"UNSTALL_COORD_WINDOW": "2", "UNSTALL_COORD_DETACH_S": "0.3", "MEMBER_STEP_S": "0.04"}
    procs = _start(tmp_path, group, 3, env_each=lambda j: env)
    _stop_after(tmp_path, procs, 2, batches=3)
    try:
        t0 = time.monotonic()
        for p in procs[:2]:  # the others finish all epochs while it stays stopped
            _finish(p, 60)
        others_s = time.monotonic() - t0
    finally:
        os.kill(procs[2].pid, signal.SIGCONT)
    _finish(procs[2], 60)
    assert others_s < 30
    for j in range(3):
        _same(_result(tmp_path, j)["seen"], expected)
    late = _result(tmp_path, 2)["stats"]
    assert late["prepared_privately"] > 0 and late["detached"]
    assert "behind" in late["detached"][0]["why"]
    assert _shm_leftovers(group) == []


def test_detached_member_rejoins_once_it_catches_up(tmp_path, expected):
    group = f"t-rejoin-{os.getpid()}"
    env = {"UNSTALL_COORD_WINDOW": "2", "UNSTALL_COORD_DETACH_S": "0.3", "MEMBER_STEP_S": "0.06"}
    others = os.pathsep.join(str(tmp_path / f"m{j}.progress") for j in range(2))
    procs = _start(
        tmp_path, group, 3, env_each=lambda j: dict(env, MEMBER_CATCH_UP=others) if j == 2 else env
    )
    _stop_after(tmp_path, procs, 2, batches=3)
    time.sleep(1.0)  # the others go on: it is detached, its batches are reclaimed
    os.kill(procs[2].pid, signal.SIGCONT)  # then it skips steps until it has caught up
    for p in procs:
        _finish(p, 60)
    for j in range(3):
        _same(_result(tmp_path, j)["seen"], expected)
    late = _result(tmp_path, 2)["stats"]
    (event,) = late["detached"]
    assert late["prepared_privately"] > 0 and "behind" in event["why"]
    assert event["position"] <= event["rejoined_at"] < EPOCHS * PER_EPOCH
    from_group = late["taken"] + late["on_demand"]
    assert from_group + late["prepared_privately"] == EPOCHS * PER_EPOCH
    assert from_group > EPOCHS * PER_EPOCH - event["rejoined_at"] - 2  # back in the group
    assert _shm_leftovers(group) == []


def test_worker_killed_holding_a_claim_loses_no_batch(tmp_path, expected):
    group = f"t-claim-{os.getpid()}"
    victim = int(expected[0][0][0][0])  # first sample of the first batch
    procs = _start(
        tmp_path,
        group,
        2,
        epochs=1,
        env_each=lambda j: (
            {"MEMBER_KILL_WORKER_AT": str(victim), "MEMBER_LINGER_S": "4"}
            if j == 0
            else {"MEMBER_START_DELAY_S": "1.0"}
        ),
    )
    for p in procs:
        _finish(p, 60, None)
    assert "worker" in _result(tmp_path, 0)["status"].lower()  # its own loader saw the death
    _same(_result(tmp_path, 1)["seen"], expected[:PER_EPOCH])  # the other got every batch
    assert str(victim) in (tmp_path / "m1.log").read_text().split()  # by preparing it itself
    assert _shm_leftovers(group) == []


def test_stale_claim_of_dead_process_is_taken_over(tmp_path):
    group = f"t-stale-{os.getpid()}"
    loader = unstall.DataLoader(Counted(8, os.devnull), batch_size=4, seed=5, coordinate=group)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (Path(group_dir(group)) / "c0-0").write_text(f"{dead.pid} 1")
    ids = [x.flatten().tolist() for x, _ in loader]
    assert ids == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert loader.stats()["coordination"]["prepared_for_group"] == 2
    loader.close()
    assert _shm_leftovers(group) == []


def test_mismatched_member_is_refused():
    group = f"t-mis-{os.getpid()}"
    first = unstall.DataLoader(Counted(8, os.devnull), batch_size=4, seed=5, coordinate=group)
    with pytest.raises(GroupMismatch, match=r"batch_size=2 but the group has batch_size=4"):
        unstall.DataLoader(Counted(8, os.devnull), batch_size=2, seed=5, coordinate=group)
    with pytest.raises(GroupMismatch, match=r"seed=6 but the group has seed=5"):
        unstall.DataLoader(Counted(8, os.devnull), batch_size=4, seed=6, coordinate=group)
    with pytest.raises(GroupMismatch, match=r"world_size=2 but the group has world_size=1"):
        unstall.DataLoader(
            Counted(8, os.devnull), batch_size=4, seed=5, rank=0, world_size=2, coordinate=group
        )
    flipped = Counted(8, os.devnull)
    flipped.transform = "flip"
    with pytest.raises(
        GroupMismatch, match=r"transform=\"'flip'\" but the group has transform='None'"
    ):
        unstall.DataLoader(flipped, batch_size=4, seed=5, coordinate=group)
    first.close()
    assert _shm_leftovers(group) == []
