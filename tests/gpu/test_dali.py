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
from unstall.gpu.prep import ENCODED, EncodedView, collate_encoded
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
    view = EncodedView(dataset, pipeline)
    batch = collate_encoded([view.prepare(i, view.fetch([i])[0])[0] for i in range(6)])
    return batch, dataset, pipeline


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
