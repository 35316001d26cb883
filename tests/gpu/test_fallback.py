"""Engine failures at build and run time fall back (DALI -> torch engine -> CPU workers), once.

Simulated on the CPU: DALI's pipeline raising as it builds (as on a CUDA 12 machine
with DALI for CUDA 13) or as it runs, the torch engine raising too. Each failure
is logged in one line naming the engine and the cause; every sample still comes
out once, with the CPU path's crops. Also: the old per-image path is gone, and the
batch decoder is chosen by measuring.
"""

from __future__ import annotations

import importlib
import logging
import time

import pytest
import torch

import unstall
from tests.conftest import write_jpegs
from unstall.gpu import decode
from unstall.gpu.decode import GpuDecoder, cpu_decoder, fastest_decoder
from unstall.gpu.engine import ENGINE_ENV, TorchEngine, dali_importable
from unstall.pipeline import ImagePipeline
from unstall.stores import LocalStore

N, BATCH = 12, 4
needs_dali = pytest.mark.skipif(not dali_importable(), reason="pip install 'unstall[dali]'")


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory):
    return write_jpegs(tmp_path_factory.mktemp("fallback"), N, classes=N, seed=6)


def loader(root, prep, *, workers=2):
    dataset = unstall.ImageFolder(LocalStore(root), transform=ImagePipeline(seed=3))
    kw = {"batch_size": BATCH, "shuffle": True, "seed": 7, "num_workers": workers}
    return unstall.DataLoader(dataset, device="cpu", prep=prep, **kw)


def check_batches(got, want, tol):
    assert len(got) == len(want) == N // BATCH
    for (x, y), (x_cpu, y_cpu) in zip(got, want, strict=True):
        assert torch.equal(y, y_cpu)
        assert float((x - x_cpu).abs().flatten(1).mean(1).max()) < tol


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "unstall" and r.levelno >= 30]


def fail(message):
    def raises(*args, **kwargs):
        raise RuntimeError(message)

    return raises


@needs_dali
@pytest.mark.parametrize("workers", [0, 2])
def test_a_dali_pipeline_that_fails_to_build_falls_back_with_one_line(
    jpeg_dir, monkeypatch, caplog, workers
):
    from unstall.gpu.dali import DaliEngine

    monkeypatch.delenv(ENGINE_ENV, raising=False)
    cause = "CUDA driver version is insufficient for CUDA runtime version (simulated)"
    monkeypatch.setattr(DaliEngine, "_graph", fail(cause))
    want = list(loader(jpeg_dir, "cpu", workers=workers))
    gpu = loader(jpeg_dir, "gpu", workers=workers)
    assert gpu.stats()["prep_plan"]["engine"].startswith("DALI")  # chosen, not built yet
    with caplog.at_level(logging.INFO, logger="unstall"):
        for epoch in range(2):
            got = list(gpu)
            if epoch == 0:
                check_batches(got, want, 0.01)  # the torch engine resizes as the CPU path
    assert warnings_of(caplog) == [
        f"GPU stage: DALI {importlib.import_module('nvidia.dali').__version__} (CPU backend) "
        f"failed (RuntimeError: {cause}): preparing with cpu (simplejpeg) from now on"
    ]
    plan = gpu.stats()["prep_plan"]
    assert plan["engine"] == "cpu (simplejpeg)" and plan["gpu_samples"] == 2 * N
    (failure,) = plan["engine_failures"]
    assert failure.startswith("DALI ") and failure.endswith(f"(CPU backend): RuntimeError: {cause}")
    assert plan["engine_clock"] == "host"  # no CUDA: the host clock times the engine


@needs_dali
def test_a_dali_run_failure_before_any_batch_falls_back(jpeg_dir, monkeypatch, caplog):
    from unstall.gpu.dali import DaliEngine

    monkeypatch.delenv(ENGINE_ENV, raising=False)
    monkeypatch.setattr(DaliEngine, "_to_torch", fail("CUDA error: an illegal memory access"))
    want = list(loader(jpeg_dir, "cpu"))
    with caplog.at_level(logging.INFO, logger="unstall"):
        gpu = loader(jpeg_dir, "gpu")
        check_batches(list(gpu), want, 0.01)
    (line,) = warnings_of(caplog)
    assert "failed (RuntimeError: CUDA error: an illegal memory access)" in line
    assert gpu.stats()["prep_plan"]["engine"] == "cpu (simplejpeg)"


@needs_dali
def test_a_dali_failing_twice_in_a_row_after_working_falls_back(jpeg_dir, monkeypatch, caplog):
    """One failed batch after good ones is a file DALI rejects (prepared on the CPU); two in a
    row, the engine (replaced)."""
    from unstall.gpu.dali import DaliEngine

    monkeypatch.delenv(ENGINE_ENV, raising=False)
    real, calls = DaliEngine._to_torch, []

    def second_on(self, *args):
        calls.append(1)
        if len(calls) >= 2:
            raise RuntimeError("cudaErrorLaunchFailure (simulated)")
        return real(self, *args)

    monkeypatch.setattr(DaliEngine, "_to_torch", second_on)
    want = list(loader(jpeg_dir, "cpu", workers=0))
    with caplog.at_level(logging.INFO, logger="unstall"):
        gpu = loader(jpeg_dir, "gpu", workers=0)
        got = list(gpu)
    check_batches(got, want, 0.01)  # DALI, the rejected batch on the CPU, the torch engine
    lines = warnings_of(caplog)
    assert len(lines) == 2 and "rejected a batch of 4 (cudaErrorLaunchFailure" in lines[0]
    assert "failed (RuntimeError: cudaErrorLaunchFailure (simulated))" in lines[1]


@needs_dali
def test_when_every_engine_fails_the_cpu_workers_take_over(jpeg_dir, monkeypatch, caplog):
    from unstall.gpu.dali import DaliEngine

    monkeypatch.delenv(ENGINE_ENV, raising=False)
    monkeypatch.setattr(DaliEngine, "_graph", fail("no CUDA 13 driver (simulated)"))
    monkeypatch.setattr(TorchEngine, "images", fail("CUDA error: out of memory (simulated)"))
    want = list(loader(jpeg_dir, "cpu"))
    gpu = loader(jpeg_dir, "hybrid")
    with caplog.at_level(logging.INFO, logger="unstall"):
        for epoch in range(2):
            got = list(gpu)
            if epoch == 0:
                check_batches(got, want, 0.01)  # the CPU path's own pixels on both sides
    lines = warnings_of(caplog)
    assert len(lines) == 2
    assert "(RuntimeError: no CUDA 13 driver (simulated)): preparing with cpu" in lines[0]
    assert lines[1] == (
        "GPU stage: cpu (simplejpeg) failed (RuntimeError: CUDA error: out of memory "
        "(simulated)): preparing with CPU workers from now on"
    )
    plan = gpu.stats()["prep_plan"]
    assert plan["mode"] == "cpu" and plan["why"].startswith("every GPU engine failed (DALI")
    assert plan["cpu_rows_per_batch"] == BATCH
    assert plan["cpu_samples"] + plan["gpu_samples"] == 2 * N
    assert plan["gpu_samples"] <= 3 * BATCH  # only batches already split when it gave up


def test_the_old_per_image_path_is_gone():
    import unstall.gpu
    import unstall.gpu.prep

    for name in ("GpuPrep", "EncodedView", "collate_encoded"):
        assert not hasattr(unstall.gpu, name) and not hasattr(unstall.gpu.prep, name)
        with pytest.raises(ImportError):
            exec(f"from unstall.gpu.prep import {name}")


def fake(name, delay):
    """A decoder that sleeps ``delay`` s on the timed batch (not on the 2-image warm-up), then
    hands back one real decode for each JPEG; ``None``: one that fails."""
    plain = cpu_decoder()

    def decode(jpegs, device, stream):
        if delay is None:
            raise RuntimeError("nvjpeg: no device (simulated)")
        if len(jpegs) > 2:
            time.sleep(delay)
        return plain.decode(jpegs[:1], device, stream) * len(jpegs)

    return name, lambda: GpuDecoder(name, decode)


def test_the_batch_decoder_measured_fastest_is_chosen_and_why_said(monkeypatch):
    device = torch.device("cpu")
    # slow: 32 images in 2 s, 16/s; one CPU core decodes 430-540/s here alone, and fell below
    # 64/s (the old 0.5 s) once, beside the parallel tests: the slow one was chosen
    backends = (fake("slow", 2.0), fake("broken", None), fake("fast", 0.0))
    monkeypatch.setattr(decode, "BACKENDS", backends)
    monkeypatch.setattr(decode, "_measured", {})
    best, why = fastest_decoder(device)
    assert best is not None and best.name == "fast" and why.startswith("fast: measured fastest (")
    assert "broken: RuntimeError: nvjpeg: no device (simulated)" in why
    assert fastest_decoder(device)[0] is best  # measured once per device
    monkeypatch.setattr(decode, "BACKENDS", backends[:2])
    monkeypatch.setattr(decode, "_measured", {})
    best, why = fastest_decoder(device)
    assert best is None and why.startswith("no GPU decoder beats one CPU core (slow ")
    monkeypatch.setattr(decode, "BACKENDS", backends[1:2])
    monkeypatch.setattr(decode, "_measured", {})
    best, why = fastest_decoder(device)
    assert best is None and why.startswith(
        "no GPU JPEG decoder works here (broken: RuntimeError: nvjpeg: no device (simulated), "
        "cpu (simplejpeg) "
    )


def test_the_split_controller_gets_the_engines_time(jpeg_dir, monkeypatch):
    """On a CPU device the engine's host time is what the controller divides by."""
    monkeypatch.setenv(ENGINE_ENV, "torch")
    gpu = loader(jpeg_dir, "hybrid", workers=0)
    list(gpu)
    plan = gpu.stats()["prep_plan"]
    assert plan["engine_clock"] == "host" and plan["engine_s"] > 0
    assert plan["engine_ms_per_batch"] == pytest.approx(1e3 * plan["engine_s"] / 3, rel=1e-3)
    assert plan["gpu_rate_per_s"] > 0


def test_auto_without_dali_names_the_measured_decoder_or_none_and_why(monkeypatch):
    """On CUDA without DALI, "auto" gets the decoder measured fastest, or None and the reason
    (then the loader prepares on the CPU workers). Measurements stand in for a GPU here."""
    from unstall.gpu import engine

    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(engine, "dali_importable", lambda: False)
    fast = GpuDecoder("nvImageCodec", cpu_decoder().decode)
    monkeypatch.setattr(decode, "_measured", {"cuda:0": (fast, "nvImageCodec: measured fastest")})
    assert engine.available_decoder(device=cuda) == "nvImageCodec"
    assert engine.decoder_choice(cuda) == "nvImageCodec: measured fastest"
    slow = "no GPU decoder beats one CPU core (nvImageCodec 900 img/s, cpu (simplejpeg) 1,200)"
    monkeypatch.setattr(decode, "_measured", {"cuda:0": (None, slow)})
    assert engine.available_decoder(device=cuda) is None
    assert engine.decoder_choice(cuda) == slow
    assert engine.decoder_choice(torch.device("cpu")).startswith("no CUDA device")
