"""Hybrid prep end to end on the CPU: CPU workers and the GPU stage's engine split every batch.

The engine is unstall's own (a CPU decoder + batched crop/flip/normalize) or, where
DALI is installed, DALI's CPU backend: the same plumbing as on a GPU. Labels here are
sample ids (one class per image), so every check on them is a check on exact samples.
"""

from __future__ import annotations

import gc
import io
import logging
import multiprocessing
import os
import re
import threading

import numpy as np
import pytest
import torch
from PIL import Image

import unstall
from tests.conftest import check_resume, write_jpegs
from unstall.errors import SampleError
from unstall.gpu.engine import ENGINE_ENV, dali_importable
from unstall.loader.handoff import leftover_slots
from unstall.pipeline import ImagePipeline
from unstall.stores import LocalStore

N, BATCH = 12, 4
ENGINES = [
    "torch",
    pytest.param(
        "dali",
        marks=pytest.mark.skipif(not dali_importable(), reason="pip install 'unstall[dali]'"),
    ),
]
#: Mean |difference| per image from the CPU path, normalized units: both engines resize with the
#: CPU path's antialiased filter (~0.2-0.3 grey levels, 0.003-0.005). Another sample: ~1.
CLOSE = {"dali": 0.01, "torch": 0.01}


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory):
    return write_jpegs(tmp_path_factory.mktemp("hybrid"), N, classes=N, seed=5)


def loader(root, prep, *, workers=2, seed=7, shuffle=True, device="cpu", **kw):
    dataset = unstall.ImageFolder(LocalStore(root), transform=ImagePipeline(seed=3))
    return unstall.DataLoader(
        dataset,
        batch_size=BATCH,
        shuffle=shuffle,
        seed=seed,
        device=device,
        prep=prep,
        num_workers=workers,
        **kw,
    )


def assert_same_samples(got, want, tol):
    """Batch by batch: the same labels (sample ids) and each image close to the CPU path's."""
    assert len(got) == len(want)
    for (x, y), (x_cpu, y_cpu) in zip(got, want, strict=True):
        x, y = x.cpu(), y.cpu()
        assert torch.equal(y, y_cpu)
        assert x.shape == x_cpu.shape and x.dtype == torch.float32
        per_image = (x - x_cpu).abs().flatten(1).mean(1)
        assert float(per_image.max()) < tol, per_image


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize(("prep", "workers"), [("hybrid", 2), ("hybrid", 0), ("gpu", 2)])
def test_every_sample_once_with_the_cpu_paths_crops(jpeg_dir, monkeypatch, engine, prep, workers):
    monkeypatch.setenv(ENGINE_ENV, engine)
    want = list(loader(jpeg_dir, "cpu", workers=workers))
    hybrid = loader(jpeg_dir, prep, workers=workers)
    assert hybrid.prep == prep
    for epoch in range(2):
        got = list(hybrid)
        ids = torch.cat([y for _, y in got]).tolist()
        assert sorted(ids) == list(range(N))  # labels are sample ids: each exactly once
        if epoch == 0:  # same seed, same order, same per-batch crops and flips
            assert_same_samples(got, want, CLOSE[engine])
    plan = hybrid.stats()["prep_plan"]
    assert plan["cpu_samples"] + plan["gpu_samples"] == 2 * N
    assert plan["engine"].startswith("DALI" if engine == "dali" else "cpu")
    if prep == "hybrid":  # every batch is split: at least one sample on each side
        assert plan["mode"] == "hybrid" and plan["cpu_samples"] >= 6 and plan["gpu_samples"] >= 6
    else:
        assert plan["mode"] == "gpu" and plan["cpu_samples"] == 0


@pytest.mark.parametrize("engine", ENGINES)
def test_a_loop_left_early_leaves_no_batch_in_the_engine(jpeg_dir, monkeypatch, engine):
    """The stage feeds the engine the next batch before taking this one (DALI has two in
    flight): a loop left after one batch must not leave the fed batch's images to be handed
    out in the next epoch. Epoch 1 after a broken epoch 0 equals a fresh loader's epoch 1."""
    monkeypatch.setenv(ENGINE_ENV, engine)
    want = loader(jpeg_dir, "gpu")
    list(want)
    want = list(want)  # epoch 1 of an undisturbed loader
    broken = loader(jpeg_dir, "gpu")
    for _batch in broken:
        break  # the next batch was already fed to the engine
    got = list(broken)  # epoch 1: its own order and crops, no leftover images
    assert_same_samples(got, want, 1e-6)
    assert sorted(torch.cat([y for _, y in got]).tolist()) == list(range(N))


class SampleIds:
    """A hybrid loader seen through its labels (sample ids), for the shared resume helper."""

    def __init__(self, inner):
        self.inner = inner

    def __iter__(self):
        return (y for _, y in self.inner)

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state):
        self.inner.load_state_dict(state)


@pytest.mark.parametrize("engine", ENGINES)
def test_resume_mid_epoch_gives_the_exact_rest(jpeg_dir, monkeypatch, engine):
    monkeypatch.setenv(ENGINE_ENV, engine)
    check_resume(lambda: SampleIds(loader(jpeg_dir, "hybrid")))
    # and the images after a resume are the uninterrupted run's (same per-batch crops)
    want = list(loader(jpeg_dir, "cpu"))[2:]
    first = loader(jpeg_dir, "hybrid")
    it = iter(first)
    next(it), next(it)
    state = first.state_dict()
    del it, first
    second = loader(jpeg_dir, "hybrid")
    second.load_state_dict(state)
    assert_same_samples(list(second), want, CLOSE[engine])


def special_jpegs():
    """A CMYK JPEG, a progressive one and a PNG: the CPU path decodes all three with PIL."""
    rng = np.random.default_rng(1)
    pixels = rng.integers(0, 255, (300, 400, 3), np.uint8)
    out = {}
    for name, save in (
        ("cmyk.jpg", lambda im, f: im.convert("CMYK").save(f, "JPEG", quality=90)),
        ("progressive.jpg", lambda im, f: im.save(f, "JPEG", quality=90, progressive=True)),
        ("png.jpg", lambda im, f: im.save(f, "PNG")),
    ):
        buf = io.BytesIO()
        save(Image.fromarray(pixels), buf)
        out[name] = buf.getvalue()
    return out


@pytest.mark.parametrize("engine", ENGINES)
def test_images_the_engine_may_reject_are_prepared_like_the_cpu_path(tmp_path, monkeypatch, engine):
    monkeypatch.setenv(ENGINE_ENV, engine)
    root = write_jpegs(tmp_path, 5, classes=8, seed=2)
    for i, (name, data) in enumerate(special_jpegs().items()):
        (root / f"c{5 + i}").mkdir()
        (root / f"c{5 + i}" / name).write_bytes(data)
    want = list(loader(root, "cpu", workers=0))
    got = list(loader(root, "gpu", workers=0))  # nothing on the CPU but what must be
    assert_same_samples(got, want, CLOSE[engine])


@pytest.mark.parametrize("engine", ENGINES)
def test_an_image_neither_side_decodes_is_named(tmp_path, monkeypatch, engine):
    monkeypatch.setenv(ENGINE_ENV, engine)
    root = write_jpegs(tmp_path, 4, classes=4, seed=2)
    broken = root / "c2" / "002.jpg"
    broken.write_bytes(broken.read_bytes()[:400])  # header intact, scan data gone
    with pytest.raises(SampleError, match=r"key 'c2/002.jpg'") as info:
        list(loader(root, "gpu", workers=0, shuffle=False))
    assert info.value.key == "c2/002.jpg"


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("zero_copy", [False, True])
def test_shutdown_leaves_no_thread_process_or_shared_memory(
    jpeg_dir, monkeypatch, engine, zero_copy
):
    monkeypatch.setenv(ENGINE_ENV, engine)
    shm_before = set(os.listdir("/dev/shm"))
    threads_before, native_before = set(threading.enumerate()), native_threads()
    hybrid = loader(jpeg_dir, "hybrid", zero_copy=zero_copy)
    it = iter(hybrid)
    next(it)  # stop mid-epoch, workers and the engine busy
    assert multiprocessing.active_children() or hybrid.num_workers == 0
    ours = {os.getpid(), *(p.pid for p in multiprocessing.active_children())}
    del it, hybrid
    gc.collect()
    assert leftover_slots() == []
    assert set(threading.enumerate()) <= threads_before
    assert native_threads() <= native_before
    assert [p.pid for p in multiprocessing.active_children()] == []
    # segments this process or its workers made (a parallel test's, named by its pid, are not)
    new = set(os.listdir("/dev/shm")) - shm_before
    assert {n for n in new if ours & {int(x) for x in re.findall(r"\d+", n)}} == set()


def test_prep_gpu_on_a_cpu_device_logs_its_engine_in_one_line(jpeg_dir, monkeypatch, caplog):
    monkeypatch.setenv(ENGINE_ENV, "torch")
    with caplog.at_level(logging.INFO, logger="unstall"):
        hybrid = loader(jpeg_dir, "hybrid")
    lines = [r.getMessage() for r in caplog.records if r.name == "unstall"]
    assert lines == ["prep='hybrid': decoding with cpu (simplejpeg) on cpu"]
    assert hybrid.stats()["prep_plan"]["why"].startswith("prep='hybrid' asked")


def test_prep_settings_that_cannot_work_name_the_fix(jpeg_dir):
    dataset = unstall.ImageFolder(LocalStore(jpeg_dir), transform=ImagePipeline())
    with pytest.raises(ValueError, match="prep='hybrid' prepares on a device"):
        unstall.DataLoader(dataset, batch_size=4, prep="hybrid")
    with pytest.raises(ValueError, match="collate_fn"):
        unstall.DataLoader(dataset, batch_size=4, prep="gpu", device="cpu", collate_fn=list)
    raw = unstall.ImageFolder(LocalStore(jpeg_dir), raw=True)
    with pytest.raises(ValueError, match="prep='hybrid' replaces the standard"):
        unstall.DataLoader(raw, batch_size=4, prep="hybrid", device="cpu")


def test_default_on_a_cpu_device_prepares_on_the_workers(jpeg_dir):
    dataset = unstall.ImageFolder(LocalStore(jpeg_dir), transform=ImagePipeline())
    plain = unstall.DataLoader(dataset, batch_size=4, device="cpu")
    assert plain.prep == "cpu" and plain.stats()["prep_plan"] == {"mode": "cpu"}
    assert unstall.DataLoader(dataset, batch_size=4, prep="auto").prep == "cpu"  # no device


def test_auto_measures_then_settles_and_says_why(jpeg_dir, monkeypatch, caplog):
    monkeypatch.setenv(ENGINE_ENV, "torch")
    auto = loader(jpeg_dir, "auto")
    want = list(loader(jpeg_dir, "cpu"))
    with caplog.at_level(logging.INFO, logger="unstall"):
        for epoch in range(4):  # 3 batches an epoch: it decides after 8
            got = list(auto)
            assert sorted(torch.cat([y for _, y in got]).tolist()) == list(range(N))
            if epoch == 0:
                assert_same_samples(got, want, CLOSE["torch"])
    plan = auto.stats()["prep_plan"]
    assert plan["requested"] == "auto" and plan["mode"] in ("cpu", "gpu", "hybrid")
    assert plan["why"].startswith("measured CPU workers ~") and plan["gpu_rate_per_s"] > 0
    lines = [r.getMessage() for r in caplog.records if "chose" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(f"prep='auto' chose {plan['mode']} after 8")
    assert plan["cpu_samples"] + plan["gpu_samples"] == 4 * N


def test_coordinated_loaders_and_a_cache_work_with_hybrid_prep(jpeg_dir, monkeypatch):
    """Two members of one group, each batch prepared once (split and all) and shared."""
    monkeypatch.setenv(ENGINE_ENV, "torch")
    group = f"hybrid-{os.getpid()}"
    first = loader(jpeg_dir, "hybrid", workers=1, coordinate=group)
    second = loader(jpeg_dir, "hybrid", workers=1, coordinate=group)
    want = list(loader(jpeg_dir, "cpu", workers=1))
    a, b = [], []
    for x, y in zip(first, second, strict=True):
        a.append(x)
        b.append(y)
    assert_same_samples(a, want, CLOSE["torch"])
    assert_same_samples(b, want, CLOSE["torch"])
    shared = first.stats()["coordination"], second.stats()["coordination"]
    assert shared[0]["taken"] + shared[1]["taken"] > 0  # some batches came from the other
    cached = loader(jpeg_dir, "hybrid", cache=unstall.Cache(2**24))
    for _ in range(2):
        ids = torch.cat([y for _, y in cached]).tolist()
        assert sorted(ids) == list(range(N))
    assert cached.stats()["cache"]["hits"] >= N  # the second epoch read from the cache


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("prep", ["hybrid", "gpu", "auto"])
def test_on_cuda_every_sample_once_with_the_cpu_paths_crops(tmp_path, prep):
    """The GPU stage on the device (DALI's mixed decoder where installed), odd files included."""
    root = write_jpegs(tmp_path, 9, classes=12, seed=2)
    for i, (name, data) in enumerate(special_jpegs().items()):
        (root / f"c{9 + i}").mkdir()
        (root / f"c{9 + i}" / name).write_bytes(data)
    want = list(loader(root, "cpu"))
    got = list(loader(root, prep, device="cuda"))
    assert got[0][0].is_cuda
    assert_same_samples(got, want, 0.08)  # GPU IDCT and chroma upsampling differ slightly
