"""DALI as the GPU stage's engine: unstall's boxes and flips in, the CPU path's pixels out."""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest
import torch

import unstall
from tests.conftest import write_jpegs
from unstall.errors import SampleError
from unstall.gpu import available_decoder
from unstall.gpu.prep import ENCODED, EncodedImage, _encode, draw
from unstall.pipeline import ImagePipeline
from unstall.stores import LocalStore

pytest.importorskip("nvidia.dali", reason="DALI: pip install 'unstall[dali]'")
from unstall.gpu.dali import DaliEngine

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
    ),
]


@pytest.fixture(scope="module")
def encoded(tmp_path_factory):
    """Six encoded samples with their boxes and flips drawn by unstall, and the dataset."""
    root = write_jpegs(tmp_path_factory.mktemp("dali"), 6, classes=2, seed=4)
    pipeline = ImagePipeline(seed=8)
    dataset = unstall.ImageFolder(LocalStore(root), transform=pipeline)
    return encode(pipeline, dataset.fetch(range(6))), dataset, pipeline


def encode(pipeline, raws):
    """An encoded batch of ``raws``, boxes and flips drawn by ``pipeline``, as workers pack it."""
    return _encode([EncodedImage(raw, *draw(pipeline, raw), i) for i, raw in enumerate(raws)])


@pytest.mark.parametrize("device", DEVICES)
def test_dali_applies_the_given_boxes_and_flips_like_the_cpu_path(encoded, device):
    batch, dataset, pipeline = encoded
    engine = DaliEngine(pipeline, torch.device(device), batch_size=8, key_of=dataset.key)
    assert engine.name.startswith("DALI 2.")
    got = engine(batch, torch.device(device)).cpu()
    assert got.shape == (6, 3, 224, 224) and got.dtype == torch.float32
    assert set(batch["flips"].tolist()) == {True, False}
    raw = dataset.fetch(range(6))
    std = torch.tensor(pipeline.std).view(3, 1, 1)
    for k in range(6):
        box, flip = tuple(batch["boxes"][k].tolist()), bool(batch["flips"][k])
        want = pipeline.apply(raw[k], box, flip=flip)
        grey = (got[k] - want).abs() * std * 255  # in grey levels
        assert float(grey.mean()) < 0.5 and float(grey.max()) < (3.5 if device == "cpu" else 12)
        unflipped = pipeline.apply(raw[k], box, flip=not flip)
        assert float((got[k] - unflipped).abs().mean()) > 10 * float((got[k] - want).abs().mean())
    smaller = {key: v[:2] for key, v in batch.items() if key != ENCODED}
    smaller["offsets"] = batch["offsets"][:3]
    smaller[ENCODED] = batch[ENCODED][: int(batch["offsets"][2])]
    torch.testing.assert_close(engine(smaller, torch.device(device)).cpu(), got[:2])
    engine.close()


def test_a_batch_dali_rejects_is_prepared_on_the_cpu_or_named(encoded):
    batch, dataset, pipeline = encoded
    engine = DaliEngine(pipeline, torch.device("cpu"), batch_size=8, key_of=dataset.key)
    want = engine(batch, torch.device("cpu"))
    data, offsets = batch[ENCODED].numpy(), batch["offsets"].tolist()
    broken = dict(batch)
    cut = offsets[3] + 300
    broken[ENCODED] = torch.from_numpy(np.concatenate([data[:cut], data[offsets[4] :]]))
    broken["offsets"] = torch.tensor(offsets[:4] + [o - (offsets[4] - cut) for o in offsets[4:]])
    with pytest.raises(SampleError, match=rf"sample 3 \(key {dataset.key(3)!r}\)"):
        engine(broken, torch.device("cpu"))
    assert engine.rejected_batches == 1
    torch.testing.assert_close(engine(batch, torch.device("cpu")), want)  # still usable


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("order", ["pipelined", "one at a time"])
def test_batches_in_flight_come_back_in_order_and_equal(encoded, order, device):
    """Depth 2: feeding the next batches before taking the first gives the same images; fewer
    batches than the depth (an epoch of one batch) pad DALI's first run and still work."""
    batch, dataset, pipeline = encoded
    device = torch.device(device)
    parts = []
    for a, b in ((0, 2), (2, 5), (5, 6), (0, 6)):
        part = {key: v[a:b] for key, v in batch.items() if key not in (ENCODED, "offsets")}
        lo, hi = int(batch["offsets"][a]), int(batch["offsets"][b])
        part[ENCODED] = batch[ENCODED][lo:hi]
        part["offsets"] = batch["offsets"][a : b + 1] - lo
        parts.append(part)
    sync = DaliEngine(pipeline, device, batch_size=8, key_of=dataset.key)
    want = [sync(p, device) for p in parts]
    engine = DaliEngine(pipeline, device, batch_size=8, key_of=dataset.key, prefetch=3)
    if order == "pipelined":
        handles = [engine.submit(p, device) for p in parts[:3]]
        got = [engine.finish(h) for h in handles]
        got.append(engine(parts[3], device))
    else:
        got = [engine(p, device) for p in parts]
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    assert engine.produced == 4 and engine.rejected_batches == 0
    timings = engine.timings()
    assert timings["dali_feed_cpu_ms_per_batch"] > 0 and timings["dali_wait_ms_per_batch"] > 0
    assert timings["dali_wait_cpu_ms_per_batch"] >= 0 and timings["rejected_batches"] == 0
    engine.close()


def test_a_forked_child_dropping_an_engine_does_not_hang(encoded):
    """Workers fork from a process whose engines have DALI threads they do not inherit."""
    batch, dataset, pipeline = encoded
    engine = DaliEngine(pipeline, torch.device("cpu"), batch_size=8, key_of=dataset.key)
    engine(batch, torch.device("cpu"))
    pid = os.fork()
    if pid == 0:  # child: what a torch worker's gc did to a dead loader's engine
        engine.close()
        gc.collect()
        os._exit(0)
    for _ in range(100):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the child hung destroying the inherited DALI pipeline")
    assert os.waitstatus_to_exitcode(status) == 0


def test_available_decoder_names_dali():
    assert available_decoder().startswith("DALI 2.")
