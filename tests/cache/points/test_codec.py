"""A prepared sample as bytes and back: exact (bit for bit), and compact where that holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from unstall.cache.points import codec


def same(a: object, b: object) -> bool:
    """Equal in type, dtype, shape and every bit (nested)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bits(a) == bits(b)
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, Image.Image):
        return (a.mode, a.size, a.info, a.tobytes()) == (b.mode, b.size, b.info, b.tobytes())
    if isinstance(a, float):
        return a.hex() == b.hex()
    return a == b


def bits(x: torch.Tensor) -> bytes:
    return x.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def roundtrip(x: object) -> object:
    return codec.decode(codec.encode(x))


def test_python_values_and_structures_come_back_exactly():
    sample = (
        7,
        -(2**70),
        0.1,
        -0.0,
        float("inf"),
        "clip",
        b"\x00raw",
        None,
        True,
        [1, (2, 3)],
        {"label": 3, 4: [5.5], ("a", 1): None},
    )
    back = roundtrip(sample)
    assert same(sample, back)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.int64, torch.uint8, torch.bool]
)
def test_tensors_of_every_dtype_are_bit_identical(dtype):
    g = torch.Generator().manual_seed(1)
    x = (torch.randn(3, 17, generator=g) * 100).to(dtype)
    assert same(x, roundtrip(x))
    assert same(x.t(), roundtrip(x.t()))  # non-contiguous: the same values


def test_whole_pixel_floats_are_stored_as_uint8_and_come_back_as_floats():
    pixels = torch.randint(0, 256, (3, 32, 32), generator=torch.Generator().manual_seed(2))
    x = pixels.float()
    data = codec.encode(x)
    assert codec.compact_kind(x) == "uint8"
    assert len(data) < x.numel() * 1 + 300  # a byte a value, not four
    assert same(x, codec.decode(data))


def test_sixteen_bit_audio_as_float_is_stored_as_int16_exactly():
    rng = np.random.default_rng(3)
    pcm = rng.integers(-32768, 32767, 8000).astype(np.int16)
    audio = pcm.astype(np.float32) / 32768
    data = codec.encode(torch.from_numpy(audio))
    assert codec.compact_kind(audio) == "int16"
    assert len(data) < 2 * 8000 + 300
    back = codec.decode(data)
    assert same(torch.from_numpy(audio), back)
    assert same(audio.astype(np.float64), roundtrip(audio.astype(np.float64)))


def test_values_that_do_not_fit_stay_exact():
    x = torch.linspace(0, 1, 1000)
    assert codec.compact_kind(x) == "exact"
    assert same(x, roundtrip(x))
    negzero = torch.zeros(100)
    negzero[5] = -0.0
    assert codec.compact_kind(negzero) == "exact"  # -0.0 would come back as +0.0
    assert same(negzero, roundtrip(negzero))
    nan = torch.full((100,), 3.0)
    nan[0] = float("nan")
    assert same(nan, roundtrip(nan))


def test_numpy_arrays_scalars_pil_images_and_other_objects():
    rng = np.random.default_rng(4)
    image = Image.fromarray(rng.integers(0, 256, (20, 30, 3), dtype=np.uint8))
    image.info = {"jfif": 257, "jfif_density": (1, 1)}
    objects = np.array(["a", None], dtype=object)
    sample = {
        "a": rng.random((4, 5)),
        "i": np.int32(7),
        "img": image,
        "obj": objects,
        "gray": image.convert("L"),
    }
    back = roundtrip(sample)
    assert same(sample["a"], back["a"]) and same(sample["i"], back["i"])
    assert same(sample["img"], back["img"]) and same(sample["gray"], back["gray"])
    assert back["obj"].tolist() == ["a", None]


def test_not_an_encoded_sample_is_an_error():
    with pytest.raises(ValueError, match="not an encoded sample"):
        codec.decode(b"JUNKJUNKJUNK")
