"""The training process's receive of each batch from its workers (the result queue, the
tensors rebuilt from shared memory, the hand-off's slot), timed by `unstall analyze` in the
real run as it is and priced into every configuration with workers (`Rates.receive_cpu_s`).

The synthetic run hands out one batch again, so it never pays a receive: a price built on
its process CPU alone (as the sample cache's is, at the model's rate) left it out and was
a third over its verification on the audio example. The script here
(tests/analysis/scripts/big_batches.py) hands out 1 MB samples, 16 to a batch: large to
receive, cheap to make.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tests.analysis.conftest import run_analyze
from tests.scripts import load_script
from unstall import DataLoader
from unstall.analysis.model.predict import Config, predict
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend.option import Job
from unstall.analysis.recommend.samples import sample_cache_row

SCRIPT = Path(__file__).resolve().parent / "scripts" / "big_batches.py"
OPTIONS = ["--steps", "12", "--warmup", "3", "--min-seconds", "1", "--quick"]
#: The analyzer's receive and the test's own, timed in different processes on a machine
#: others share, agree within this factor either way.
FACTOR = 3.0

RATES = Rates(
    20000.0, prep_cpu_s=0.0005, cores=2.0, sample_bytes=1.0, bandwidth=math.inf, latency_s=0.0
)
BASE = Config(workers=2, batch_size=16)
FACTS = {"applies": True, "samples": 1000, "bytes_per_sample": 8192, "read_s": 0.0002}
FACTS.update(collate_s=0.0003, prep_s=0.018, how="checked", loop_s=0.00005)


def test_every_price_with_workers_pays_the_receive() -> None:
    """0.5 ms of the workers' CPU, 0.05 ms of the process's own and 0.1 ms of receive per
    sample on 2 cores: 2 / 0.65 ms, as it is and with the sample cache (whose process term
    is its loop's at the model's rate, plus the receive)."""
    rates = replace(RATES, proc_cpu_s=0.00005, receive_cpu_s=0.0001)
    assert rates.process_cpu_s == pytest.approx(0.00015)
    assert predict(rates, BASE).caps["cores"] == pytest.approx(2 / 0.00065)
    assert predict(replace(rates, receive_cpu_s=0.0), BASE).caps["cores"] == pytest.approx(
        2 / 0.00055
    )
    row = sample_cache_row(Job(rates, BASE, 95.0), FACTS, room=None)
    assert row.predicted == pytest.approx(2 / (0.0005 + 0.00005 + 0.0001), rel=1e-3)
    per = row.facts["worker_cpu_ms_per_sample"]
    assert per["receive"] == 0.1 and per["process"] == 0.15, per


def _own_receive(batches: int = 24, skip: int = 4) -> float:
    """CPU seconds per sample this thread spends in ``next()`` on the script's own Dataset
    under unstall's loader (the one ``unstall analyze`` runs it under): the receive,
    timed here without the analyzer."""
    module = load_script(SCRIPT, "big_batches_under_test")
    loader = DataLoader(module.Images(16 * (batches + skip)), batch_size=16, num_workers=2)
    cpu, samples = 0.0, 0
    it = iter(loader)
    for i in range(batches + skip):
        c0 = time.thread_time()
        images, _ = next(it)
        if i >= skip:  # the workers' start-up aside
            cpu += time.thread_time() - c0
            samples += len(images)
        del images
        time.sleep(0.004)  # the model's step: the workers run ahead, as in the script
    del it
    loader.close()
    return cpu / samples


@pytest.mark.timed
@pytest.mark.timeout(120)
def test_the_receive_is_measured_in_the_real_run_and_priced(tmp_path) -> None:
    report = run_analyze(tmp_path, OPTIONS, [sys.executable, str(SCRIPT)])
    rates = report["rates"]
    receive = rates["receive_cpu_s"]
    own = _own_receive()
    assert receive > 0 and own > 0, (receive, own)
    assert 1 / FACTOR <= receive / own <= FACTOR, (receive, own)
    # the model's price of the job as it is holds it: the cores shared by the workers and
    # the whole process, its own CPU and its receive
    priced = predict(Rates(**rates), Config(workers=2, batch_size=16))
    want = rates["cores"] / (rates["prep_cpu_s"] + rates["proc_cpu_s"] + receive)
    assert priced.caps["cores"] == pytest.approx(want), priced.caps
