"""The GPU stage's engines give the CPU path's pixels for the files phones and scanners write.

JPEGs tagged with every EXIF orientation (1-8), CMYK, progressive and grey: DALI
(its CPU backend here, the decoder ``mixed`` falls back to) must not rotate (the
CPU path never does, and the crop boxes are drawn on the stored size), so each
image is within 0.01 (normalized units, per-image mean) of the CPU path's for the
same crop and flip, and no batch goes to the per-image CPU fallback.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

import unstall
from unstall.gpu.decode import cpu_decoder
from unstall.gpu.engine import ENGINE_ENV, TorchEngine, dali_importable
from unstall.gpu.prep import EncodedImage, _encode, draw
from unstall.pipeline import ImagePipeline
from unstall.stores import LocalStore

KINDS = [*(f"exif{k}" for k in range(1, 9)), "cmyk", "progressive", "grey"]
needs_dali = pytest.mark.skipif(not dali_importable(), reason="pip install 'unstall[dali]'")


def photo(kind: str, seed: int) -> bytes:
    """A 400 x 300 JPEG (wider than high, so a rotation would show) of the given kind."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:300, 0:400]
    smooth = np.stack([x * 255 // 400, y * 255 // 300, (x + y) * 255 // 700], -1)
    pixels = np.clip(smooth + rng.integers(-25, 25, smooth.shape), 0, 255).astype(np.uint8)
    image, out = Image.fromarray(pixels), io.BytesIO()
    if kind.startswith("exif"):
        exif = Image.Exif()
        exif[0x0112] = int(kind[4:])  # Orientation
        image.save(out, "JPEG", quality=90, exif=exif.tobytes())
    elif kind == "cmyk":
        image.convert("CMYK").save(out, "JPEG", quality=90)
    elif kind == "progressive":
        image.save(out, "JPEG", quality=90, progressive=True)
    else:
        image.convert("L").save(out, "JPEG", quality=90)
    return out.getvalue()


def test_the_files_are_what_they_say():
    for k in range(1, 9):
        assert Image.open(io.BytesIO(photo(f"exif{k}", 0))).getexif()[0x0112] == k
    assert Image.open(io.BytesIO(photo("cmyk", 0))).mode == "CMYK"
    assert Image.open(io.BytesIO(photo("grey", 0))).mode == "L"
    assert Image.open(io.BytesIO(photo("progressive", 0))).info.get("progressive") == 1


def per_image_error(got: torch.Tensor, pipeline, raws, batch) -> list[float]:
    """Mean |engine - CPU path| per image, for the batch's own boxes and flips."""
    out = []
    for k, raw in enumerate(raws):
        box, flip = tuple(batch["boxes"][k].tolist()), bool(batch["flips"][k])
        want = pipeline.apply(raw, box, flip=flip)
        out.append(float((got[k].cpu() - want).abs().mean()))
    return out


#: Per-image mean bound [normalized units]: DALI's CPU backend is the CPU path's libjpeg-turbo
#: (measured 0.0033); ``mixed`` decodes with the GPU's IDCT (bound to be measured on a GPU).
BOUND = {"cpu": 0.01, "cuda": 0.02}


@needs_dali
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
        ),
    ],
)
def test_dali_engine_gives_the_cpu_paths_pixels(seed, device):
    from unstall.gpu.dali import DaliEngine

    pipeline = ImagePipeline(seed=seed)
    raws = [photo(kind, seed) for kind in KINDS]
    batch = _encode([EncodedImage(r, *draw(pipeline, r), i) for i, r in enumerate(raws)])
    engine = DaliEngine(pipeline, torch.device(device), batch_size=len(KINDS), key_of=str)
    got = engine(batch, torch.device(device)).cpu()
    errors = per_image_error(got, pipeline, raws, batch)
    assert max(errors) < BOUND[device], dict(zip(KINDS, errors, strict=True))
    assert engine.rejected_batches == 0 and engine.produced == 1
    # a rotated decode would be far off: the CPU path turned by a quarter differs by ~1
    turned = torch.rot90(got[0], 1, (1, 2))
    assert float((turned - got[0]).abs().mean()) > 0.2
    engine.close()


def test_torch_engine_does_not_rotate_either():
    """The torch engine (unstall's CPU decoder here) neither rotates: the same pixels too."""
    pipeline = ImagePipeline(seed=3)
    raws = [photo(kind, 3) for kind in KINDS]
    batch = _encode([EncodedImage(r, *draw(pipeline, r), i) for i, r in enumerate(raws)])
    got = TorchEngine(pipeline, cpu_decoder(), key_of=str)(batch, torch.device("cpu"))
    assert max(per_image_error(got, pipeline, raws, batch)) < 0.01


@pytest.fixture
def phone_photos(tmp_path):
    """An image folder of every kind, one class per file (labels are sample ids)."""
    for i, kind in enumerate(KINDS):
        (tmp_path / f"c{i:02d}").mkdir()
        (tmp_path / f"c{i:02d}" / f"{kind}.jpg").write_bytes(photo(kind, 10 + i))
    return tmp_path


@needs_dali
@pytest.mark.parametrize("workers", [0, 2])
def test_loader_with_dali_gives_the_cpu_paths_batches(phone_photos, monkeypatch, workers):
    monkeypatch.setenv(ENGINE_ENV, "dali")

    def make(prep):
        dataset = unstall.ImageFolder(LocalStore(phone_photos), transform=ImagePipeline(seed=4))
        return unstall.DataLoader(
            dataset, batch_size=4, seed=2, device="cpu", prep=prep, num_workers=workers
        )

    gpu = make("gpu")
    got, want = list(gpu), list(make("cpu"))
    assert len(got) == len(want) == 3
    for (x, y), (x_cpu, y_cpu) in zip(got, want, strict=True):
        assert torch.equal(y, y_cpu)
        per_image = (x - x_cpu).abs().flatten(1).mean(1)
        assert float(per_image.max()) < 0.01, per_image
    plan = gpu.stats()["prep_plan"]
    assert plan["engine"].startswith("DALI") and "engine_failures" not in plan
    assert plan["rejected_batches"] == 0  # no batch went to the per-image CPU fallback
    assert plan["gpu_samples"] >= len(KINDS) - 1  # CMYK alone may be sent to the CPU workers
