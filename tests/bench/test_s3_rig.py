"""The `bench s3` rig's core split: storage and loader pinned apart, every thread, then restored."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from unstall.bench.s3_rig import pinned, split_cpus

TWO_THREADS = (
    "import threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True).start();"
    "print('up', flush=True); time.sleep(60)"
)


def affinities(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_split_pins_every_thread_and_restores():
    ours, storage = split_cpus()
    everything = os.sched_getaffinity(0)
    assert ours | storage == everything and not ours & storage and len(storage) == 1
    child = subprocess.Popen([sys.executable, "-c", TWO_THREADS], stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline() == b"up\n"
        assert len(affinities(child.pid)) == 2
        with pinned({child.pid: storage, os.getpid(): ours}):
            assert affinities(child.pid) == [storage, storage]
            assert os.sched_getaffinity(0) == ours
            forked = subprocess.run(
                [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            assert forked.stdout.strip() == str(sorted(ours))  # inherited by new processes
        assert affinities(child.pid) == [everything, everything]
        assert os.sched_getaffinity(0) == everything
    finally:
        child.kill()
        child.wait()
