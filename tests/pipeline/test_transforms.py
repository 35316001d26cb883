"""ImagePipeline: torchvision semantics, DCT-scaled decode, seeding, flip, uint8 + normalize."""

from __future__ import annotations

import io
import math
import multiprocessing
import pickle
import random

import numpy as np
import pytest
import torch
from PIL import Image

from unstall.data.synthetic import render_image
from unstall.pipeline import (
    IMAGENET_STD,
    DecodeError,
    ImagePipeline,
    TorchReferencePipeline,
    normalize_batch,
)
from unstall.pipeline.crop import center_crop_box, dct_scale, random_resized_crop_box

STD = torch.tensor(IMAGENET_STD).view(3, 1, 1)


@pytest.fixture(scope="module")
def images() -> list[bytes]:
    return [render_image(3, i, classes=2) for i in range(6)]


@pytest.fixture(scope="module")
def big_jpeg() -> bytes:
    """A 1600x1200 photo-like JPEG, large enough for DCT downscaling."""
    small = Image.open(io.BytesIO(render_image(4, 0, classes=1))).convert("RGB")
    out = io.BytesIO()
    small.resize((1600, 1200), Image.BICUBIC).save(out, "JPEG", quality=90)
    return out.getvalue()


def _grey_levels(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| of two normalized float images, in 0-255 pixel units."""
    return (a - b).abs() * STD * 255


@pytest.mark.parametrize(("output", "dtype"), [("float", torch.float32), ("uint8", torch.uint8)])
def test_output_shape_and_dtype(images: list[bytes], output: str, dtype: torch.dtype) -> None:
    out = ImagePipeline(output=output, seed=0)(images[0])
    assert out.shape == (3, 224, 224) and out.dtype == dtype and out.is_contiguous()
    assert ImagePipeline((160, 192), output=output)(images[1]).shape == (3, 160, 192)


def test_uint8_then_normalize_batch_equals_float(images: list[bytes]) -> None:
    floats = ImagePipeline(seed=11)
    lean = ImagePipeline(seed=11, output="uint8")
    expected = torch.stack([floats(b) for b in images])
    batch = torch.stack([lean(b) for b in images])
    got = normalize_batch(batch)
    assert got.dtype == torch.float32 and got.shape == (6, 3, 224, 224)
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)
    cl = normalize_batch(batch, channels_last=True)
    assert cl.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(cl, expected, atol=1e-6, rtol=0)
    assert normalize_batch(batch, dtype=torch.bfloat16).dtype == torch.bfloat16


def test_normalize_batch_rejects_float_and_bad_shape() -> None:
    with pytest.raises(ValueError, match=r"dtype torch\.float32, expected torch\.uint8"):
        normalize_batch(torch.zeros(2, 3, 8, 8))
    with pytest.raises(ValueError, match=r"shape \(3, 8, 8\)"):
        normalize_batch(torch.zeros(3, 8, 8, dtype=torch.uint8))


def test_matches_torchvision_reference_on_same_box(images: list[bytes]) -> None:
    ours, ref = ImagePipeline(), TorchReferencePipeline()
    for data, box, flip in zip(
        images,
        [(10, 20, 300, 250), (0, 0, 500, 333), (100, 40, 120, 150)] * 2,
        [0, 1] * 3,
        strict=True,
    ):
        diff = _grey_levels(
            ours.apply(data, box, flip=bool(flip)), ref.apply(data, box, flip=bool(flip))
        )
        assert float(diff.max()) <= 1.001  # torch's uint8 resize vs PIL's: one grey level at most
        assert float(diff.mean()) < 0.1


def test_crop_box_statistics() -> None:
    rng = random.Random(0)
    fractions, aspects = [], []
    for _ in range(3000):
        left, top, w, h = random_resized_crop_box(500, 375, rng)
        assert 0 <= left <= 500 - w and 0 <= top <= 375 - h and w > 0 and h > 0
        fractions.append(w * h / (500 * 375))
        aspects.append(w / h)
    # w and h are rounded to whole pixels, so bounds hold up to half a pixel each side
    assert 0.08 * 0.99 <= min(fractions) < 0.1 and 0.9 < max(fractions) <= 1.0
    assert 0.75 * 0.99 <= min(aspects) < 0.77 and 1.31 < max(aspects) <= 4 / 3 * 1.01
    # same distribution as torchvision's get_params (here on torch's generator)
    torch.manual_seed(0)
    ref = TorchReferencePipeline()
    ref_boxes = [ref.get_params(500, 375) for _ in range(3000)]
    ref_fractions = [w * h / (500 * 375) for _, _, w, h in ref_boxes]
    assert abs(np.mean(fractions) - np.mean(ref_fractions)) < 0.02
    assert abs(np.median(aspects) - np.median([w / h for _, _, w, h in ref_boxes])) < 0.03
    square = [random_resized_crop_box(400, 400, rng) for _ in range(3000)]
    assert abs(float(np.median([math.log(w / h) for _, _, w, h in square]))) < 0.03


def test_crop_falls_back_to_center_crop_like_torchvision() -> None:
    # a 2000x100 strip: no crop with aspect <= 4/3 and area >= 8 % fits, every try fails
    assert random_resized_crop_box(2000, 100, random.Random(1)) == (933, 0, 133, 100)
    assert center_crop_box(100, 2000, (3 / 4, 4 / 3)) == (0, 933, 100, 133)
    assert center_crop_box(400, 400, (3 / 4, 4 / 3)) == (0, 0, 400, 400)


def test_flip_flips(images: list[bytes]) -> None:
    flipped = ImagePipeline(flip_p=1.0, seed=5, output="uint8")
    plain = ImagePipeline(flip_p=0.0, seed=5, output="uint8")
    for data in images[:3]:
        a, b = flipped(data), plain(data)
        assert not torch.equal(a, b)
        assert np.array_equal(a.numpy(), np.flip(b.numpy(), axis=2))


def test_dct_scaled_decode_is_close_to_full_decode(big_jpeg: bytes) -> None:
    box = (100, 50, 1000, 900)
    assert dct_scale(box, (224, 224)) == 4
    assert dct_scale((0, 0, 447, 500), (224, 224)) == 1
    pipe = ImagePipeline(output="uint8")
    scaled = pipe.apply(big_jpeg, box).float()
    full = pipe.apply(big_jpeg, box, dct=False).float()
    assert (scaled - full).abs().mean() < 2.0  # grey levels
    assert not torch.equal(scaled, full)  # it did take the other path
    ref = TorchReferencePipeline().apply(big_jpeg, box)
    assert float(_grey_levels(ImagePipeline().apply(big_jpeg, box), ref).mean()) < 2.0


@pytest.mark.parametrize("data", [b"junk", b"\xff\xd8\xff\xe0\x00\x10JFIF"])
def test_corrupt_bytes_raise(data: bytes) -> None:
    with pytest.raises(DecodeError, match="cannot decode image"):
        ImagePipeline()(data)


def test_grayscale_and_png_inputs() -> None:
    gray = np.random.default_rng(0).integers(0, 256, (300, 400), dtype=np.uint8)
    for fmt in ("JPEG", "PNG"):
        out = io.BytesIO()
        Image.fromarray(gray).save(out, fmt)
        x = ImagePipeline(output="uint8", seed=0)(out.getvalue())
        assert x.shape == (3, 224, 224)
        assert torch.equal(x[0], x[1]) and torch.equal(x[1], x[2])


def test_seed_reproduces_and_differs(images: list[bytes]) -> None:
    a, b, c = ImagePipeline(seed=7), ImagePipeline(seed=7), ImagePipeline(seed=8)
    outs_a = [a(d) for d in images[:3]]
    assert all(torch.equal(x, b(d)) for x, d in zip(outs_a, images[:3], strict=True))
    assert not all(torch.equal(x, c(d)) for x, d in zip(outs_a, images[:3], strict=True))


def test_pickle_round_trip_keeps_settings_and_stream(images: list[bytes]) -> None:
    pipe = ImagePipeline(192, output="uint8", flip_p=0.25, seed=3)
    copy = pickle.loads(pickle.dumps(pipe))
    assert repr(copy) == repr(pipe)
    assert torch.equal(copy(images[0]), pipe(images[0]))  # same process, same seed: same stream
    assert len(pickle.dumps(pipe)) < 2000  # cheap to send to workers


def _draws(pipe: ImagePipeline, queue: multiprocessing.Queue) -> None:
    rng = pipe.process_rng()
    queue.put([rng.random() for _ in range(4)])


@pytest.mark.parametrize("seed", [None, 9])
def test_forked_workers_get_their_own_streams(seed: int | None) -> None:
    pipe = ImagePipeline(seed=seed)
    parent = [pipe.process_rng().random() for _ in range(4)]
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_draws, args=(pipe, queue)) for _ in range(2)]
    for p in procs:
        p.start()
    children = [queue.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    assert children[0] != children[1]
    assert parent not in children


def test_bad_settings_name_the_value() -> None:
    with pytest.raises(ValueError, match="output='half'"):
        ImagePipeline(output="half")
    with pytest.raises(ValueError, match=r"scale=\(0.5, 0.1\)"):
        ImagePipeline(scale=(0.5, 0.1))
    with pytest.raises(ValueError, match=r"flip_p=1\.5"):
        ImagePipeline(flip_p=1.5)
    with pytest.raises(ValueError, match="size=0"):
        ImagePipeline(0)


def test_reference_pipeline_follows_torch_seed(images: list[bytes]) -> None:
    ref = TorchReferencePipeline()
    torch.manual_seed(0)
    a = ref(images[0])
    torch.manual_seed(0)
    b = ref(images[0])
    assert a.shape == (3, 224, 224) and a.dtype == torch.float32 and torch.equal(a, b)
    assert ref.get_params(2000, 100) == (933, 0, 133, 100)  # same fallback as ours
