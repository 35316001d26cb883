"""`unstall.machine`: the machine's facts and the ``$UNSTALL_*`` settings, read when asked."""

from __future__ import annotations

import os

import pytest

from unstall import machine


def test_cores_are_the_affinity_capped_by_the_cgroup_quota(monkeypatch):
    mine = len(os.sched_getaffinity(0))
    monkeypatch.setattr(machine, "_cgroup_quota", lambda: None)
    assert machine.cores_available() == mine
    monkeypatch.setattr(machine, "_cgroup_quota", lambda: 0.5)  # half a core: still one
    assert machine.cores_available() == 1
    monkeypatch.setattr(machine, "_cgroup_quota", lambda: 1000.0)  # more than we may run on
    assert machine.cores_available() == mine


def test_directories_follow_the_environment_when_asked(monkeypatch, tmp_path):
    monkeypatch.setenv("UNSTALL_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("UNSTALL_SHM_DIR", str(tmp_path))
    assert machine.cache_dir() == str(tmp_path / "c")
    assert machine.shm_dir() == str(tmp_path)
    assert machine.free_bytes() > 0
    monkeypatch.delenv("UNSTALL_CACHE_DIR")
    monkeypatch.delenv("UNSTALL_SHM_DIR")
    assert machine.cache_dir() == os.path.expanduser("~/.cache/unstall")
    assert machine.shm_dir() == "/dev/shm"


def test_memory_is_read_from_the_node():
    total, available = machine.memory_total_bytes(), machine.memory_available_bytes()
    assert available is not None and 0 < available <= total


def test_a_bad_number_names_the_variable(monkeypatch):
    monkeypatch.setenv("UNSTALL_S3_RETRIES", "many")
    with pytest.raises(ValueError, match="UNSTALL_S3_RETRIES='many' must be int"):
        machine.s3_retries()
    monkeypatch.setenv("UNSTALL_S3_RETRIES", "")
    assert machine.s3_retries() == 6


def test_environment_is_put_back(monkeypatch):
    monkeypatch.delenv("UNSTALL_TIMELINE", raising=False)
    with machine.environment({"UNSTALL_TIMELINE": "1"}):
        assert machine.timeline()
    assert not machine.timeline() and "UNSTALL_TIMELINE" not in os.environ
    monkeypatch.setenv("UNSTALL_CACHE_DIR", "/before")
    with machine.environment({"UNSTALL_CACHE_DIR": "/during", "UNSTALL_TIMELINE": "1"}):
        assert machine.cache_dir() == "/during" and machine.timeline()
    assert os.environ["UNSTALL_CACHE_DIR"] == "/before" and "UNSTALL_TIMELINE" not in os.environ


def test_the_facts_module_stays_cheap_to_import():
    """Every process of a run that reads a fact imports it: the standard library's light
    parts only (unittest.mock, which loads asyncio, cost each 0.17 s)."""
    import subprocess
    import sys

    heavy = "('asyncio', 'unittest', 'numpy', 'torch')"
    code = f"import sys, unstall.machine; print(sorted(m for m in {heavy} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr


def test_cpu_ticks_count_only_the_cores_this_process_may_use():
    """Pinned to one core, the busy and idle time are that core's line of /proc/stat; over the
    whole affinity, their sum (what moved between the reads: a few ticks a core)."""
    cpus = sorted(os.sched_getaffinity(0))
    per = []
    try:
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            per.append(machine.cpu_ticks())
        os.sched_setaffinity(0, set(cpus))
        every = machine.cpu_ticks()
    finally:
        os.sched_setaffinity(0, set(cpus))
    assert every is not None and all(t is not None for t in per)
    moved = every.busy + every.idle - sum(t.busy + t.idle for t in per)
    assert 0 <= moved <= 50 * len(cpus)  # at most half a second a core between the reads
    if len(cpus) > 1:  # one core's figures are not the machine's
        assert all(t.busy + t.idle < every.busy + every.idle for t in per)
