"""The device path: device="cpu" runs CUDA's code; uint8 + on-device normalize == float."""

from __future__ import annotations

import gc
import logging

import pytest
import torch

import unstall
from tests.conftest import write_jpegs
from unstall.loader.device import DeviceStage, NormalizeImages
from unstall.loader.handoff import leftover_slots
from unstall.loader.sampling import worker_base_seed
from unstall.pipeline import ImagePipeline
from unstall.stores import LocalStore

from .test_slots import Images, check_batch


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory):
    return write_jpegs(tmp_path_factory.mktemp("jpegs"), 24, classes=3, seed=7)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_device_cpu_yields_identical_batches(num_workers):
    def run(**kw):
        loader = unstall.DataLoader(
            Images(72), batch_size=8, shuffle=True, seed=4, num_workers=num_workers, **kw
        )
        return [(x.clone(), y.clone()) for x, y in loader], loader

    plain = run()[0]
    on_device, loader = run(device="cpu")
    assert len(plain) == len(on_device) == 9
    for (a, la), (b, lb) in zip(plain, on_device, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
        check_batch(b, lb)
    stats = loader.stats()
    assert stats["batches"] == 9 and stats["samples"] == 72
    assert stats["main_cpu_ms_per_batch"] > 0
    assert stats["stage"]["count"] == 9 and stats["stage_cpu_s"] > 0  # copy + transform
    assert "stage" not in run()[1].stats()  # no device: no device stage
    if num_workers:
        assert stats["zero_copy"]["slot_batches"] > 0
    del loader
    gc.collect()
    assert leftover_slots() == []


def test_device_cpu_state_dict_counts_batches_handed_out():
    loader = unstall.DataLoader(Images(40), batch_size=8, device="cpu")
    it = iter(loader)
    next(it), next(it)
    assert loader.state_dict()["batches_done"] == 2  # the batch prepared ahead is not counted


def test_uint8_normalized_on_device_equals_float_pipeline(jpeg_dir):
    def batches(output, **kw):  # same worker seeds, so the same crops in the same workers
        kw.update(num_workers=2, seed=0, generator=torch.Generator().manual_seed(0))
        ds = unstall.ImageFolder(
            LocalStore(jpeg_dir), transform=ImagePipeline(output=output, seed=3)
        )
        return list(unstall.DataLoader(ds, batch_size=6, **kw))

    floats = batches("float")
    lean = batches("uint8", device="cpu", device_transform=NormalizeImages())
    by_default = batches("uint8", device="cpu")  # NormalizeImages is the default for uint8
    assert len(floats) == len(lean) == len(by_default) == 4
    for (a, la), (b, lb), (c, lc) in zip(floats, lean, by_default, strict=True):
        assert b.dtype == c.dtype == torch.float32 and b.shape == a.shape == (6, 3, 224, 224)
        assert torch.equal(la, lb) and torch.equal(la, lc)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        assert torch.equal(b, c)


def test_normalize_images_layout_dtype_and_float_passthrough():
    x = torch.randint(0, 256, (2, 3, 4, 5), dtype=torch.uint8)
    out = NormalizeImages(channels_last=True, dtype=torch.bfloat16)((x, torch.arange(2)))
    assert out[0].dtype == torch.bfloat16 and out[0].is_contiguous(
        memory_format=torch.channels_last
    )
    assert torch.equal(out[1], torch.arange(2))
    ref = (x.float() / 255 - torch.tensor([0.485, 0.456, 0.406]).view(-1, 1, 1)) / torch.tensor(
        [0.229, 0.224, 0.225]
    ).view(-1, 1, 1)
    torch.testing.assert_close(out[0].float(), ref, atol=2e-2, rtol=1e-2)
    f = torch.randn(2, 3, 4, 5)
    assert torch.equal(NormalizeImages()(f), f)


def test_stage_copies_so_no_slot_memory_is_handed_out():
    stage = DeviceStage(torch.device("cpu"))
    src = torch.arange(6)
    out = stage.finish(stage.submit(src))
    assert torch.equal(out, src) and out.data_ptr() != src.data_ptr()
    stage.close()


def test_bad_device_options_name_the_fix():
    with pytest.raises(ValueError, match="device_transform"):
        unstall.DataLoader(Images(8), device_transform=NormalizeImages())
    with pytest.raises(ValueError, match="device='bogus'"):
        unstall.DataLoader(Images(8), device="bogus")
    with pytest.raises(ValueError, match="prep='tpu'"):
        unstall.DataLoader(Images(8), prep="tpu")
    with pytest.raises(ValueError, match="zero_copy=True needs num_workers"):
        unstall.DataLoader(Images(8), zero_copy=True)


def test_gpu_prep_on_a_cpu_device_runs_the_stage_with_a_cpu_engine(jpeg_dir, caplog, monkeypatch):
    monkeypatch.setenv("UNSTALL_PREP_ENGINE", "torch")

    def make(**kw):
        ds = unstall.ImageFolder(LocalStore(jpeg_dir), transform=ImagePipeline(seed=1))
        return unstall.DataLoader(ds, batch_size=8, **kw)

    with caplog.at_level(logging.INFO, logger="unstall"):
        loader = make(prep="gpu", device="cpu")
    lines = [r.getMessage() for r in caplog.records if r.name == "unstall"]
    assert lines == ["prep='gpu': decoding with cpu (simplejpeg) on cpu"]
    assert loader.prep == "gpu"
    for (a, la), (b, lb) in zip(make(), loader, strict=True):
        assert torch.equal(la, lb) and float((a - b).abs().mean()) < 0.08


def test_gpu_prep_rejects_non_standard_pipelines(jpeg_dir):
    ds = unstall.ImageFolder(LocalStore(jpeg_dir), raw=True)
    with pytest.raises(ValueError, match="prep='gpu' replaces the standard"):
        unstall.DataLoader(ds, prep="gpu")


def test_worker_augmentation_follows_the_loader_seed_and_epoch(jpeg_dir):
    """Workers' random streams come from (seed, epoch, rank): same seed, same crops."""

    def epochs(seed, **kw):
        pipeline = ImagePipeline(output="uint8", seed=2)
        ds = unstall.ImageFolder(LocalStore(jpeg_dir), transform=pipeline)
        loader = unstall.DataLoader(ds, batch_size=6, seed=seed, num_workers=2, **kw)
        return [torch.cat([x for x, _ in loader]) for _ in range(2)]

    first, again = epochs(1), epochs(1)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], first[1])  # a new epoch draws new crops
    assert not torch.equal(first[0], epochs(9)[0])
    seeds = {worker_base_seed(seed=1, epoch=e, rank=r) for e in range(3) for r in range(3)}
    assert len(seeds) == 9 and all(0 <= s < 2**63 for s in seeds)
    torch.manual_seed(0)  # a user generator keeps torch's rule: base seed drawn from it
    user = epochs(1, generator=torch.Generator().manual_seed(5))
    assert torch.equal(user[0], epochs(1, generator=torch.Generator().manual_seed(5))[0])
