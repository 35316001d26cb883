"""What the agent measures of the whole-sample cache in the job's process: a hit's cost timed
on the worker's own path (`SampleCache.get` on a segment made for the timing and removed),
and the verification's fill, by as many processes as the loader has workers, storing every
sample exactly. A file's version computed per hit (`file_version`) is the same int64 as the
listing's columns give (`mix`)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from unstall.analysis.measure.script.samples import prefill_samples, sample_cache_facts, spread
from unstall.cache.files import file_version
from unstall.loader.cache_binding import resolve_cache
from unstall.stores.listing import mix, mix_ints

FILES = 24
SIZE = 4096


class FileTensors(torch.utils.data.Dataset):
    """Sample i: file i's bytes as a float32 tensor (deterministic), and i."""

    def __init__(self, root: Path):
        self.files = sorted(str(p) for p in root.iterdir())

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with open(self.files[i], "rb") as f:
            data = np.frombuffer(f.read(), dtype=np.uint8)
        return torch.from_numpy(data.astype(np.float32) / 3.0), i


@pytest.fixture
def dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FileTensors:
    monkeypatch.setenv("UNSTALL_SHM_NAMESPACE", f"facts{os.getpid()}")
    old = time.time_ns() - 60 * 10**9  # settled: the cache stores no file just written
    for i in range(FILES):
        path = tmp_path / f"{i:03d}.bin"
        path.write_bytes(bytes((i * 11 + k) % 253 for k in range(SIZE)))
        os.utime(path, ns=(old, old))
    return FileTensors(tmp_path)


def _segments() -> list[str]:
    return sorted(n for n in os.listdir("/dev/shm") if f"facts{os.getpid()}" in n)


def test_a_hit_is_timed_on_the_workers_path_and_its_segment_removed(dataset):
    facts = sample_cache_facts(dataset)
    assert facts["applies"] is True and facts["how"] == "checked", facts
    assert facts["read_timed"] == "hit", facts  # the segment was made: the real path timed
    assert facts["samples"] == FILES
    # float32 pixels of /3.0 are not compact: 4 bytes a value, plus the header
    assert SIZE * 4 <= facts["bytes_per_sample"] < SIZE * 4 + 512, facts
    assert 0 < facts["read_s"] < 0.05 and 0 < facts["collate_s"] < 0.05, facts
    # timed in forked processes (a worker's fresh mapping): each hit's wall time varies
    assert facts["read_cv"] > 0, facts
    assert _segments() == []
    # a round reads 32 MB of entries, at least the checked samples, at most the dataset
    assert spread(1000, 320_000, 3) == 104 and spread(50, 320_000, 3) == 50
    assert spread(10**6, 100, 3) == 256 and spread(2, 10**9, 3) == 3


def test_the_fill_by_two_processes_stores_every_sample_exactly(dataset):
    binding = resolve_cache({"size": "16MiB", "hold": "samples"}, dataset)
    layer = binding.bind(dataset)  # the loader's: the fill binds the same segment
    try:
        filled = prefill_samples(binding, dataset, workers=2)
        assert filled == {"stored": FILES, "files": FILES, "complete": True, "hold": "samples"}

        def not_stored(i: int) -> None:
            raise AssertionError(f"sample {i} was not stored by the fill")

        for i in range(FILES):
            tensor, label = layer.get(i, not_stored)
            want, want_label = dataset[i]
            assert label == want_label == i
            assert tensor.dtype == want.dtype and torch.equal(tensor, want)
        assert layer.stats()["cache"]["items_cached"] == FILES
    finally:
        layer.close()
        binding.cache.close()
    assert _segments() == []


def test_a_files_version_per_hit_is_the_listings_int64():
    st = os.stat(__file__)
    cols = [np.array([v], dtype=np.int64) for v in (st.st_size, st.st_mtime_ns, st.st_ino)]
    cols.append(np.array([st.st_dev], dtype=np.uint64).view(np.int64))
    assert file_version(st) == int(mix(*cols)[0]) != 0
    rng = np.random.default_rng(5)
    for row in rng.integers(-(2**63), 2**63 - 1, size=(200, 4), dtype=np.int64):
        values = [int(v) for v in row]
        assert mix_ints(*values) == int(mix(*(np.array([v]) for v in values))[0])
    edges = [0, -1, 2**63 - 1, -(2**63)]
    assert mix_ints(*edges) == int(mix(*(np.array([v], dtype=np.int64) for v in edges))[0])


def test_the_workers_hand_off_is_timed_on_the_real_loader_and_priced(dataset, monkeypatch):
    """Around each task a worker takes it, sends the batch on and drops its samples: CPU its
    spans leave out, timed on unstall's loader at the job's batch size (the timeline needed:
    `unstall analyze` sets it), and added to a cached sample's price."""
    from dataclasses import replace

    from unstall.analysis.measure.script.handoff import handoff_seconds
    from unstall.analysis.model.predict import Config
    from unstall.analysis.rates.result import Rates
    from unstall.analysis.recommend.option import Job
    from unstall.analysis.recommend.samples import sample_cache_row

    assert "handoff_s" not in sample_cache_facts(dataset)  # no batch size: not timed
    monkeypatch.delenv("UNSTALL_TIMELINE", raising=False)
    assert handoff_seconds(lambda k: torch.zeros(8), 4, 8) is None  # no timeline: not timed
    monkeypatch.setenv("UNSTALL_TIMELINE", "1")
    clips = [torch.full((80_000,), float(k)) for k in range(4)]  # the audio example's size
    took = handoff_seconds(lambda k: (clips[k].clone(), k), len(clips), 32)
    assert took is not None and 1e-6 < took < 0.01, took
    facts = sample_cache_facts(dataset, 8, None)
    assert 0 < facts["handoff_s"] < 0.01, facts
    rates = Rates(1e5, prep_cpu_s=0.02, cores=2.0, sample_bytes=1.0, bandwidth=1e12, latency_s=0)
    job = Job(replace(rates, proc_cpu_s=0.0), Config(workers=2, batch_size=8), 90.0)
    row = sample_cache_row(job, facts, room=None)
    per = row.facts["worker_cpu_ms_per_sample"]
    assert per["handoff"] == round(facts["handoff_s"] * 1e3, 3), per
    hit = facts["read_s"] + facts["collate_s"] + facts["handoff_s"]
    assert per["cached"] == round(hit * 1e3, 3), per
    assert _segments() == []


def test_samples_the_loader_cannot_batch_leave_the_hand_off_unpriced(monkeypatch):
    """A collate that fails on the samples (the job's own would fail alike) is no failure of
    the measurement: the hand-off goes unpriced."""
    from unstall.analysis.measure.script.handoff import handoff_seconds

    monkeypatch.setenv("UNSTALL_TIMELINE", "1")

    def refuse(batch: list) -> None:
        raise ValueError("cannot batch these")

    assert handoff_seconds(lambda k: k, 2, 4, refuse) is None
