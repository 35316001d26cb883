"""`unstall analyze` prices the GPU remedy by a short run of the GPU stage on the job's files."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import write_jpegs
from unstall.analysis.model.predict import Config
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend import remedies as remedies_module
from unstall.analysis.recommend.option import Job
from unstall.analysis.recommend.remedies import Seen, remedies
from unstall.analysis.report.words import row
from unstall.gpu import gpu_prep_rate
from unstall.gpu.engine import ENGINE_ENV


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = write_jpegs(tmp_path_factory.mktemp("probe"), 6, classes=2, seed=9)
    return sorted(str(p) for p in root.rglob("*.jpg"))


def test_without_cuda_nothing_is_measured(files):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert gpu_prep_rate(files) is None
    assert gpu_prep_rate([]) is None


def test_the_stage_is_timed_on_the_files_it_is_given(files, monkeypatch):
    """On a CPU device the same plumbing runs (the torch engine here, fast and always there)."""
    monkeypatch.setenv(ENGINE_ENV, "torch")
    got = gpu_prep_rate(files, device=torch.device("cpu"), batch_size=4, batches=2)
    assert got is not None and got["samples"] == 8 and got["batch_size"] == 4
    assert got["gpu_per_s"] > 0 and got["engine"]
    assert gpu_prep_rate(["/nonexistent.jpg"], device=torch.device("cpu")) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_gpu_stage_is_timed(files):
    got = gpu_prep_rate(files, batch_size=8, batches=2)
    assert got is not None and got["gpu_per_s"] > 0


def test_the_gpu_remedy_is_priced_only_from_a_measured_rate(monkeypatch):
    rates = Rates(ingestion=5000.0, prep_cpu_s=0.004, cores=8, sample_bytes=1e5,
                  bandwidth=1e10, latency_s=0.0)  # fmt: skip
    base = Config(workers=8, batch_size=256, inflight=16)
    job = Job(rates, base, 2000.0, "prep")
    decoder = "DALI 2.4.0 (mixed: hardware JPEG decoder, else nvJPEG)"
    probe = {"gpu_per_s": 2500.0, "engine": decoder, "samples": 256, "batch_size": 64}

    def gpu_row(**seen) -> dict:
        return next(row(o) for o in remedies(job, Seen(**seen)) if o.remedy == "gpu")

    # the engine alone is not what the loader gets from it at present: listed, not priced
    gpu = gpu_row(cuda=True, decoder=decoder, gpu=probe)
    assert gpu["predicted_samples_per_s"] is None and gpu["unpriced"] == "stage_short"
    assert "prepares 2,500 images/s alone" in gpu["not_applicable"] and gpu["probe"] == probe
    assert "prep='lean'" in gpu["not_applicable"]
    monkeypatch.setattr(remedies_module, "GPU_STAGE_PRICED", True)  # once the stage keeps it
    gpu = gpu_row(cuda=True, decoder=decoder, gpu=probe)
    assert gpu["predicted_samples_per_s"] == 4500.0 and gpu["probe"] == probe  # 2,000 + 2,500
    probe["gpu_per_s"] = 9000.0  # together past the model's own rate: capped by G
    gpu = gpu_row(cuda=True, decoder=decoder, gpu=probe)
    assert gpu["predicted_samples_per_s"] <= 5000.0
    for cuda, dec in ((False, decoder), (True, None), (True, decoder)):
        gpu = gpu_row(cuda=cuda, decoder=dec)
        assert gpu["predicted_samples_per_s"] is None and "not measured" in gpu["not_measured"]
