"""Batched crop/flip/normalize equals the per-image loop; the torch engine runs on the CPU too."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

import unstall
from tests.conftest import write_jpegs
from unstall.errors import SampleError
from unstall.gpu.augment import (
    crop_flip_normalize,
    pad_batch,
    reference_crop_flip_normalize,
    size_groups,
)
from unstall.gpu.decode import GpuDecoder, cpu_decoder
from unstall.gpu.engine import ENGINE_ENV, TorchEngine
from unstall.gpu.prep import ENCODED, EncodedImage, _encode, draw
from unstall.loader.handoff import leftover_slots
from unstall.pipeline import ImagePipeline, decode_jpeg
from unstall.stores import LocalStore

SHAPES = [(375, 500), (300, 200), (64, 80), (500, 375), (224, 224)]
BOXES = [
    (10, 20, 300, 200),  # downscale
    (0, 0, 200, 300),  # the whole image
    (5, 7, 30, 20),  # strong upscale, borders clamp to the crop
    (100, 50, 275, 450),  # touches right and bottom edges
    (0, 0, 224, 224),  # identity size
]


def images():
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=g) for h, w in SHAPES]


@pytest.mark.parametrize("size", [(224, 224), (96, 128)])
def test_batched_equals_per_image_reference(size):
    ims, boxes = images(), torch.tensor(BOXES)
    flips = torch.tensor([False, True, True, False, True])
    got = crop_flip_normalize(ims, boxes, flips, size)
    want = reference_crop_flip_normalize(ims, boxes, flips, size)
    assert got.shape == (5, 3, *size)
    torch.testing.assert_close(got, want, atol=5e-4, rtol=0)  # 0.03 grey levels


def test_size_groups_cover_every_image_once_within_the_budget():
    shapes = [(375, 500), (4000, 3000), (300, 200), (500, 375), (64, 80), (2000, 100), (224, 224)]
    budget = 3 * 600 * 600
    groups = size_groups(shapes, budget)
    assert sorted(i for g in groups for i in g) == list(range(len(shapes)))
    assert [1] in groups  # larger than the budget: alone
    for g in groups:
        padded = len(g) * 3 * max(shapes[i][0] for i in g) * max(shapes[i][1] for i in g)
        assert padded <= budget or len(g) == 1
    assert size_groups(shapes, 10**12) == [[1, 5, 0, 3, 2, 6, 4]]  # largest first, one group


@pytest.mark.parametrize("max_elements", [1, 3 * 300 * 300, 10**9])
def test_grouped_crops_equal_the_reference_in_input_order(max_elements):
    ims, boxes = images(), torch.tensor(BOXES)
    flips = torch.tensor([True, False, True, False, True])
    got = crop_flip_normalize(ims, boxes, flips, (64, 48), max_elements=max_elements)
    want = reference_crop_flip_normalize(ims, boxes, flips, (64, 48))
    torch.testing.assert_close(got, want, atol=5e-4, rtol=0)


def test_box_outside_its_image_is_an_error_naming_it():
    ims = images()
    boxes = torch.tensor(BOXES)
    boxes[2] = torch.tensor([60, 0, 30, 20])  # image 2 is 80 wide
    with pytest.raises(ValueError, match=r"box 2 .* \(60, 0, 30, 20\) is not inside its 80 x 64"):
        crop_flip_normalize(ims, boxes, torch.zeros(5, dtype=torch.bool), (8, 8))


def test_identity_box_returns_the_pixels_and_flip_mirrors():
    ims = images()[4:]
    box = torch.tensor([[0, 0, 224, 224]])
    plain = crop_flip_normalize(ims, box, torch.tensor([False]), (224, 224), mean=None, std=None)
    flipped = crop_flip_normalize(ims, box, torch.tensor([True]), (224, 224), mean=None, std=None)
    assert torch.equal(plain[0].round().to(torch.uint8), ims[0])
    assert torch.equal(flipped[0].round().to(torch.uint8), ims[0].flip(-1))


def test_layout_dtype_and_shape_errors():
    ims = images()
    out = crop_flip_normalize(
        pad_batch(ims),
        torch.tensor(BOXES),
        torch.zeros(5, dtype=torch.bool),
        (32, 32),
        dtype=torch.bfloat16,
        channels_last=True,
    )
    assert out.dtype == torch.bfloat16 and out.is_contiguous(memory_format=torch.channels_last)
    with pytest.raises(ValueError, match=r"expected \(5, 4\)"):
        crop_flip_normalize(ims, torch.tensor(BOXES[:2]), torch.zeros(5, dtype=torch.bool), (8, 8))


@pytest.fixture(scope="module")
def jpeg_dir(tmp_path_factory):
    return write_jpegs(tmp_path_factory.mktemp("jpegs"), 16, classes=2, seed=11)


def encode(pipeline, dataset, indices, raws=None):
    """An encoded batch as the workers pack it: bytes, boxes and flips drawn by ``pipeline``."""
    raws = dataset.fetch(indices) if raws is None else raws
    pairs = zip(indices, raws, strict=True)
    return _encode([EncodedImage(r, *draw(pipeline, r), i) for i, r in pairs])


def test_boxes_follow_the_pipelines_seeded_stream(jpeg_dir):
    def boxes():
        pipeline = ImagePipeline(seed=21)
        dataset = unstall.ImageFolder(LocalStore(jpeg_dir), transform=pipeline)
        return [draw(pipeline, dataset.fetch([i])[0]) for i in range(16)]

    first, second = boxes(), boxes()
    assert first == second and len({b for b, _ in first}) > 1
    assert {f for _, f in first} == {True, False}


def test_undecodable_image_raises_sample_error_naming_the_key(jpeg_dir):
    pipeline = ImagePipeline(seed=0)
    dataset = unstall.ImageFolder(LocalStore(jpeg_dir), transform=pipeline)
    good = dataset.fetch([0])[0]
    broken = good[:200]  # header intact, scan data missing
    batch = encode(pipeline, dataset, [0, 3], [good, good])
    batch[ENCODED] = torch.from_numpy(np.frombuffer(good + broken, dtype=np.uint8).copy())
    batch["offsets"] = torch.tensor([0, len(good), len(good) + len(broken)])
    with pytest.raises(ValueError):
        decode_jpeg(broken)
    assert dataset.key(3) == "c0/006.jpg"
    with pytest.raises(SampleError, match=r"sample 3 \(key 'c0/006.jpg'\)") as info:
        TorchEngine(pipeline, cpu_decoder(), key_of=dataset.key)(batch, torch.device("cpu"))
    assert info.value.index == 3 and info.value.key == "c0/006.jpg"


def test_images_the_device_decoder_rejects_or_misshapes_are_decoded_on_the_cpu(jpeg_dir):
    pipeline = ImagePipeline(seed=4)
    dataset = unstall.ImageFolder(LocalStore(jpeg_dir), transform=pipeline)
    batch = encode(pipeline, dataset, list(range(6)))
    plain = cpu_decoder()
    asked = []

    def picky(jpegs, device, stream):  # rejects every other image, shrinks image 2
        asked.append(len(jpegs))
        out = plain.decode(jpegs, device, stream)
        out[2] = out[2][:, :16, :16]  # a size that cannot hold its box (as if turned by EXIF)
        return [None if k % 2 else im for k, im in enumerate(out)]

    want = TorchEngine(pipeline, plain, key_of=dataset.key)(batch, torch.device("cpu"))
    picky_engine = TorchEngine(pipeline, GpuDecoder("picky", picky), key_of=dataset.key)
    got = picky_engine(batch, torch.device("cpu"))
    assert asked == [6] and torch.equal(got, want)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
def test_batched_on_cuda_equals_cpu():
    ims, boxes = images(), torch.tensor(BOXES)
    flips = torch.tensor([True, False, True, False, True])
    cpu = crop_flip_normalize(ims, boxes, flips, (224, 224))
    gpu = crop_flip_normalize([im.cuda() for im in ims], boxes, flips, (224, 224))
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-3, rtol=0)


@cuda
@pytest.mark.parametrize("prep", ["gpu", "hybrid", None])
def test_loader_gpu_prep_matches_cpu_prep(jpeg_dir, prep):
    """On CUDA (DALI's mixed decoder where installed): the CPU path's samples, crops and flips."""

    def make(**kw):
        dataset = unstall.ImageFolder(LocalStore(jpeg_dir), transform=ImagePipeline(seed=5))
        return unstall.DataLoader(dataset, batch_size=8, num_workers=2, seed=1, **kw)

    loader = make(device="cuda", prep=prep)
    assert loader.prep == (prep or "auto")
    batches = list(loader)
    assert len(batches) == 2
    for (x, y), (want, labels) in zip(batches, make(prep="cpu"), strict=True):
        assert x.is_cuda and x.shape == (8, 3, 224, 224) and x.dtype == torch.float32
        assert y.is_cuda and torch.equal(y.cpu(), labels)
        per_image = (x.cpu() - want).abs().flatten(1).mean(1)
        assert float(per_image.max()) < 0.08  # decoders' IDCTs and resize filters differ slightly
    plan = loader.stats()["prep_plan"]
    assert plan["cpu_samples"] + plan["gpu_samples"] == 16


@cuda
def test_loader_device_cuda_copies_and_normalizes(jpeg_dir):
    pipeline = ImagePipeline(output="uint8", seed=5)
    dataset = unstall.ImageFolder(LocalStore(jpeg_dir), transform=pipeline)
    from unstall.loader.device import NormalizeImages

    ref = list(
        unstall.DataLoader(dataset, batch_size=8, device="cpu", device_transform=NormalizeImages())
    )
    got = list(
        unstall.DataLoader(
            dataset, batch_size=8, device="cuda", prep="cpu", device_transform=NormalizeImages()
        )
    )
    for (a, la), (b, lb) in zip(ref, got, strict=True):
        torch.testing.assert_close(b.cpu(), a, atol=1e-5, rtol=0)
        assert torch.equal(lb.cpu(), la)


def rotated_by_exif() -> bytes:
    """A 60 x 40 JPEG whose EXIF orientation (6) asks viewers to turn it a quarter."""
    import io

    from PIL import Image

    image = Image.fromarray(np.random.default_rng(3).integers(0, 255, (40, 60, 3), np.uint8))
    exif = Image.Exif()
    exif[0x0112] = 6
    out = io.BytesIO()
    image.save(out, "JPEG", exif=exif.tobytes())
    return out.getvalue()


def test_nvimgcodec_decodes_like_the_cpu_decoder(jpeg_dir):
    """The nvImageCodec adapter (its CPU backend without CUDA): RGB, CHW, None when rejected."""
    pytest.importorskip("nvidia.nvimgcodec", reason="nvImageCodec: pip install 'unstall[gpu]'")
    import simplejpeg

    from unstall.gpu.decode import _nvimgcodec

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    decoder = _nvimgcodec(cpu_only=device.type == "cpu")
    files = sorted(jpeg_dir.rglob("*.jpg"))
    gray = simplejpeg.encode_jpeg(np.full((40, 60, 1), 77, np.uint8), colorspace="GRAY")
    raw = [f.read_bytes() for f in files] + [rotated_by_exif(), b"\xff\xd8 not a jpeg" * 8, gray]
    jpegs = [torch.from_numpy(np.frombuffer(r, np.uint8).copy()) for r in raw]
    stream = torch.cuda.current_stream() if device.type == "cuda" else None
    got = decoder.decode(jpegs, device, stream)
    want = cpu_decoder().decode(jpegs, torch.device("cpu"), None)
    assert got[-2] is None and want[-2] is None
    assert want[-3].shape == (3, 40, 60)  # EXIF says rotate; neither decoder does (boxes fit)
    assert got[-1].shape == (3, 40, 60) and int(got[-1].float().mean().round()) == 77
    for g, w in zip(got[:-2], want[:-2], strict=True):
        assert g.device.type == device.type and g.shape == w.shape and g.dtype == torch.uint8
        diff = (g.cpu().int() - w.int()).abs()
        assert int(diff.max()) <= 8 and float(diff.float().mean()) < 0.5


@pytest.mark.parametrize(("num_workers", "zero_copy"), [(0, False), (2, False), (2, True)])
def test_loader_gpu_prep_path_on_cpu_matches_cpu_prep(
    jpeg_dir, monkeypatch, num_workers, zero_copy
):
    """Workers fetch bytes and draw boxes, the prep thread decodes + crops: CPU prep's output."""
    monkeypatch.setenv(ENGINE_ENV, "torch")

    def run(prep):
        pipeline = ImagePipeline(seed=5)
        dataset = unstall.ImageFolder(LocalStore(jpeg_dir), transform=pipeline)
        return unstall.DataLoader(
            dataset,
            batch_size=5,
            shuffle=True,
            seed=3,
            device="cpu",
            prep=prep,
            num_workers=num_workers,
            zero_copy=zero_copy,
        )

    loader = run("gpu")
    assert loader.prep == "gpu"
    for epoch in range(2):
        got, want = list(loader), list(run("cpu") if epoch == 0 else [])
        assert [b[0].shape for b in got] == [(5, 3, 224, 224)] * 3 + [(1, 3, 224, 224)]
        labels = torch.cat([y for _, y in got])
        assert sorted(labels.tolist()) == sorted(i % 2 for i in range(16))
        if epoch == 0:  # same seed, order and workers: same boxes, decoded at full size
            for (x, y), (x_cpu, y_cpu) in zip(got, want, strict=True):
                assert torch.equal(y, y_cpu)
                assert float((x - x_cpu).abs().mean()) < 0.01  # the CPU path's resize filter
    stats = loader.stats()
    assert stats["samples"] == 32 and stats["epochs_completed"] == 2
    assert stats["stage"]["count"] == 8 and [e["stage_s"] > 0 for e in stats["per_epoch"]] == [
        True,
        True,
    ]
    assert stats["main_cpu_s"] > 0 and stats["stage_cpu_s"] > 0  # the loop's, the stage's
    assert stats["stage_cpu_ms_per_batch"] == pytest.approx(
        1e3 * stats["stage_cpu_s"] / 8, abs=1e-3
    )
    if zero_copy:
        zero = stats["zero_copy"]  # the first epoch's first tasks go out before slots exist
        assert zero["slot_batches"] >= 4 and zero["spilled"] == 0
        del loader
        gc.collect()
        assert leftover_slots() == []
