"""The GPU stage off the training loop's thread: DALI's feed, retuning mid-epoch, the threads'
clocks and their shutdown. DALI's CPU backend runs the same plumbing as on a GPU; labels are
sample ids (one class per image), so every check on them is a check on exact samples."""

from __future__ import annotations

import gc
import threading
import time

import pytest
import torch

import unstall
from tests.conftest import write_jpegs
from unstall.gpu import plugin
from unstall.gpu.engine import ENGINE_ENV, FEED_ENV, TorchEngine, dali_importable
from unstall.gpu.prep import EncodedImage, _encode, draw
from unstall.gpu.tune import DecoderTuner, Setting
from unstall.loader.handoff import leftover_slots
from unstall.pipeline import ImagePipeline
from unstall.stores import LocalStore

N, BATCH = 12, 4
needs_dali = pytest.mark.skipif(not dali_importable(), reason="pip install 'unstall[dali]'")


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory):
    return write_jpegs(tmp_path_factory.mktemp("feed"), N, classes=N, seed=6)


def loader(root, prep, **kw):
    dataset = unstall.ImageFolder(LocalStore(root), transform=ImagePipeline(seed=3))
    return unstall.DataLoader(
        dataset, batch_size=BATCH, shuffle=True, seed=7, device="cpu", prep=prep, num_workers=2,
        **kw,
    )  # fmt: skip


def close_to(got, want):
    """Batch for batch: the same sample ids in the same order, images as the CPU path's."""
    assert [y.tolist() for _, y in got] == [y.tolist() for _, y in want]
    for (x, _), (x_cpu, _) in zip(got, want, strict=True):
        assert float((x - x_cpu).abs().flatten(1).mean(1).max()) < 0.01


@needs_dali
def test_both_feeds_give_dali_the_same_batch(jpeg_dir):
    from unstall.gpu.dali import DaliEngine

    pipeline = ImagePipeline(seed=2)
    dataset = unstall.ImageFolder(LocalStore(jpeg_dir), transform=pipeline)
    raws = dataset.fetch(range(5))
    batch = _encode([EncodedImage(r, *draw(pipeline, r), i) for i, r in enumerate(raws)])
    cpu = torch.device("cpu")
    outs = {}
    for feed in ("tensors", "arrays"):
        engine = DaliEngine(pipeline, cpu, batch_size=8, key_of=dataset.key, feed=feed)
        outs[feed] = engine(batch, cpu)
        assert engine.timings()["dali_feed"] == feed
        engine.close()
    torch.testing.assert_close(outs["tensors"], outs["arrays"], rtol=0, atol=0)
    with pytest.raises(ValueError, match="feed='lists'"):
        DaliEngine(pipeline, cpu, batch_size=8, key_of=dataset.key, feed="lists")


@needs_dali
@pytest.mark.parametrize("prep", ["gpu", "hybrid"])
def test_decoder_settings_retuned_mid_epoch_keep_every_batch(jpeg_dir, monkeypatch, prep):
    """A tuner that switches DALI's threads after every batch: each switch builds a new
    pipeline while the old one finishes the batches already fed to it."""
    monkeypatch.setenv(ENGINE_ENV, "dali")
    tuners = []

    def restless(engine, device):
        tuner = DecoderTuner(Setting(1.0, 1), max_threads=2, window=1, settle=0, pays=-1.0)
        tuners.append(tuner)
        return tuner

    monkeypatch.setattr(plugin, "decoder_tuner", restless)
    want = list(loader(jpeg_dir, "cpu"))
    tuned = loader(jpeg_dir, prep)
    close_to(list(tuned), want)
    plan = tuned.stats()["prep_plan"]
    assert tuners and tuners[0].trials >= 1
    assert plan["decoder_chosen"]["threads"] in (1, 2) and plan["decoder_rates"]
    assert plan["dali_threads"] == tuners[0].current.threads and plan["rejected_batches"] == 0


@needs_dali
def test_prep_gpu_resumed_mid_epoch_gives_the_exact_rest(jpeg_dir, monkeypatch):
    monkeypatch.setenv(ENGINE_ENV, "dali")
    want = list(loader(jpeg_dir, "cpu"))[1:]
    first = loader(jpeg_dir, "gpu")
    it = iter(first)
    next(it)  # the next batch is already fed to DALI: it must not be lost or handed twice
    state = first.state_dict()
    del it, first
    second = loader(jpeg_dir, "gpu")
    second.load_state_dict(state)
    close_to(list(second), want)


def test_main_cpu_is_the_loop_threads_and_the_stage_thread_is_counted_apart(jpeg_dir, monkeypatch):
    """An engine that burns 30 ms of CPU a batch on the GPU stage's thread: the loop's thread
    (``main_cpu_ms_per_batch``) does not pay it, ``stage_cpu_ms_per_batch`` shows it."""
    monkeypatch.setenv(ENGINE_ENV, "torch")
    real = TorchEngine.images

    def busy(self, encoded, device):
        end = time.thread_time() + 0.03
        while time.thread_time() < end:
            pass
        return real(self, encoded, device)

    monkeypatch.setattr(TorchEngine, "images", busy)
    gpu = loader(jpeg_dir, "gpu")
    assert sum(len(y) for _, y in gpu) == N
    stats = gpu.stats()
    assert stats["stage_cpu_ms_per_batch"] >= 30
    assert stats["main_cpu_ms_per_batch"] < 25


def stage_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("unstall-prep")]


@needs_dali
@pytest.mark.parametrize("how", ["break and close", "exception", "end of epoch"])
def test_the_stage_thread_stops_and_leaves_nothing(jpeg_dir, monkeypatch, how):
    monkeypatch.setenv(ENGINE_ENV, "dali")
    threads_before = set(threading.enumerate())  # /dev/shm as a whole: test_hybrid (alone)
    hybrid = loader(jpeg_dir, "hybrid", zero_copy=True)
    if how == "break and close":
        for _batch in hybrid:
            assert stage_threads()
            break
        hybrid.close()
    elif how == "exception":
        with pytest.raises(RuntimeError, match="the step failed"):
            for _batch in hybrid:
                raise RuntimeError("the step failed")
    else:
        assert sum(len(y) for _, y in hybrid) == N
        assert not stage_threads()  # the epoch's end stops the stage at once
    del hybrid
    gc.collect()
    assert not stage_threads()
    # a closed multiprocessing queue's feeder thread ends on its own a moment after the
    # workers are shut down (seen still alive under load): waited for, within 10 s
    deadline = time.monotonic() + 10
    while set(threading.enumerate()) - threads_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert set(threading.enumerate()) <= threads_before
    assert leftover_slots() == []  # this process's slots are gone from /dev/shm


def test_a_bad_feed_setting_is_named(jpeg_dir, monkeypatch):
    monkeypatch.setenv(FEED_ENV, "lists")
    with pytest.raises(ValueError, match="UNSTALL_DALI_FEED='lists'"):
        iter(loader(jpeg_dir, "gpu"))
