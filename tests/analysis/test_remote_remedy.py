"""issue 45 in the analyzer: "N remote CPUs" priced for a prep-bound job from its measured CPU
per sample and the transfer timed on one of its batches. Pure functions on made-up `Rates`
(hand-derived figures) and one small batch: milliseconds."""

from __future__ import annotations

import math

import pytest
import torch

from unstall.analysis.measure.wire import wire_probe
from unstall.analysis.model.predict import Config
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend import remote
from unstall.analysis.recommend.option import Job
from unstall.analysis.recommend.remedies import Seen, remedies
from unstall.analysis.report.terminal import remote_text
from unstall.analysis.report.words import row
from unstall.remote import Remote

BASE = Config(workers=4, batch_size=10)
#: 10 ms of CPU a sample on 4 cores, storage free (no fetch time): 4 workers give 400/s.
PREP = dict(prep_cpu_s=0.01, cores=4.0, sample_bytes=1000.0, bandwidth=math.inf, latency_s=0.0)
WIRE = {
    "samples": 10,
    "batch_bytes": 1_505_280,
    "bytes_per_sample": 150_528.0,
    "receive_cpu_s_per_sample": 0.0003,
    "repeats": 5,
}


def remote_row(rates: Rates, base: Config, measured: float, wire, **kw) -> dict:
    """The ``remote`` row as the report shows it."""
    return row(remote.remote_row(Job(rates, base, measured), wire, **kw))


def test_remote_workers_to_the_models_rate_without_a_transfer_measured() -> None:
    # G 950/s; local 400/s; each remote worker 10 / (10 x 0.01 s) = 100/s: ceil(550/100) = 6
    row = remote_row(Rates(950.0, **PREP), BASE, 400.0, None)
    assert row["remote_workers"] == 6 and row["predicted_samples_per_s"] == 950.0
    assert row["local_samples_per_s"] == 400.0 and row["per_worker_samples_per_s"] == 100.0
    assert row["bound"] == "compute" and row["predicted_speedup"] == 2.38
    assert row["config"] == {"kwargs": {"num_workers": 4, "remote": {"workers": 6}}}
    assert row["transfer"]["measured"] is False and "upper bound" in row["transfer"]["why"]
    assert Remote.of(row["config"]["kwargs"]["remote"]).workers == 6  # what --config reads


def test_the_trainers_receive_takes_from_its_thread_and_the_local_workers_cores() -> None:
    # main 0.2 ms + receive 0.3 ms: 2,000/s; the process 1 ms + 0.3 ms on 4 cores: 3,077/s;
    # G 1,800/s binds. Local alone: 4 / (0.01 + 0.0013) = 354/s (cores shared with the
    # process). At 1,800/s the process takes 2.34 of the 4 cores: local 166/s, so the remote
    # workers make up 1,634/s: ceil(16.34) = 17 workers.
    rates = Rates(1800.0, **PREP, main_cpu_s=0.0002, proc_cpu_s=0.001)
    row = remote_row(rates, BASE, 350.0, WIRE, cluster="10.0.0.1:6379")
    assert row["remote_workers"] == 17 and row["predicted_samples_per_s"] == 1800.0
    assert row["local_samples_per_s"] == 354.0 and row["bound"] == "compute"
    assert row["caps"] == {"compute": 1800.0, "fetch": math.inf, "main": 2000.0, "process": 3076.9}
    t = row["transfer"]
    assert t["measured"] and t["bytes_per_sample"] == 150528.0
    assert t["receive_cpu_ms_per_sample"] == 0.3 and t["network_mb_per_s"] == 246.0
    # 17 x 2 batches x 1.5 MB in flight < 1 GiB: no cap raised
    assert row["config"] == {"kwargs": {"num_workers": 4, "remote": {"workers": 17}}}
    assert "RAY_ADDRESS=10.0.0.1:6379" in row["applies"] and "unstall[ray]" in row["applies"]
    assert row["recommended"] is False
    text = remote_text(row)
    assert "17 x 100/s" in text and "246 MB/s" in text and "priced, not chosen" in text


def test_the_receive_itself_can_be_the_cap() -> None:
    # a receive of 1 ms a sample: the loop's thread caps the job at 1 / 1.2 ms = 833/s
    wire = {**WIRE, "receive_cpu_s_per_sample": 0.001}
    row = remote_row(Rates(5000.0, **PREP, main_cpu_s=0.0002), BASE, 400.0, wire)
    # the receive takes 0.83 of the 4 cores at 833/s: local (4 - 0.83) / 0.01 = 317/s, the
    # remote workers 517/s -> 6
    assert row["bound"] == "main" and row["remote_workers"] == 6
    assert row["predicted_samples_per_s"] == 833.3


def test_large_batches_raise_the_bytes_in_flight() -> None:
    wire = {**WIRE, "bytes_per_sample": 6e6, "batch_bytes": 60_000_000}
    row = remote_row(Rates(950.0, **PREP), BASE, 400.0, wire)
    # 6 workers x 2 batches x 60 MB = 720 MB < 1 GiB; at 12 workers: 1.44 GB
    assert "max_bytes_in_flight" not in row["config"]["kwargs"]["remote"]
    row = remote_row(Rates(1550.0, **PREP), BASE, 400.0, wire)
    assert row["remote_workers"] == 12
    assert row["config"]["kwargs"]["remote"] == {"workers": 12, "max_bytes_in_flight": "1374MiB"}


def test_local_workers_first_at_the_count_recommended():
    # the job runs 2 workers (200/s); the recommendation 4 (400/s), which fill first
    job = Config(workers=2, batch_size=10)
    row = remote_row(Rates(950.0, **PREP), job, 200.0, None)
    assert (row["remote_workers"], row["local_samples_per_s"]) == (8, 200.0)
    row = remote_row(Rates(950.0, **PREP), job, 200.0, None, workers=4)
    assert (row["remote_workers"], row["local_samples_per_s"]) == (6, 400.0)
    assert row["config"]["kwargs"]["num_workers"] == 4
    Remote.of(row["config"]["kwargs"]["remote"])


def test_no_remote_worker_where_the_local_ones_reach_the_cap() -> None:
    row = remote_row(Rates(300.0, **PREP), BASE, 300.0, WIRE)
    assert row["predicted_samples_per_s"] is None and "config" not in row
    assert "model's own rate" in row["not_applicable"]


def test_listed_for_a_prep_bound_job_only() -> None:
    rates = Rates(950.0, **PREP)
    seen = Seen(wire=WIRE)
    prep = remedies(Job(rates, BASE, 400.0, "prep"), seen)
    assert [o.remedy for o in prep][-1] == "remote"
    assert "remote" not in [o.remedy for o in remedies(Job(rates, BASE, 400.0, "fetch"), seen)]
    unknown = {"prep": "not measured"}
    assert remedies(Job(rates, BASE, 400.0, "prep", unknown), seen) == []


def test_wire_probe_on_a_batch() -> None:
    batch = (torch.zeros(8, 3, 4, 4, dtype=torch.uint8), torch.arange(8))
    w = wire_probe(batch)
    assert w is not None
    assert w["samples"] == 8 and w["batch_bytes"] == 8 * 48 + 8 * 8
    assert w["bytes_per_sample"] == pytest.approx(56.0) and w["receive_cpu_s_per_sample"] >= 0
    assert wire_probe([]) is None
