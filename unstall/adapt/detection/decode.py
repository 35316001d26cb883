"""Decode only what the plan needs: JPEG decodes deferred from ``__getitem__`` to the plan.

Within one ``dataset[i]`` call (`intercept`), ``torchvision.io``'s ``decode_jpeg``,
``decode_image`` and ``read_image`` (as module attributes and as names the dataset's
module imported) hand back, for a 3-channel JPEG, a stand-in of the image's size whose
pixels are never written (its memory is not touched), and note its bytes (`Deferred`).
When the plan receives that stand-in (the same tensor, or a ``tv_tensors.Image`` of it),
it draws the geometry on the full size, then decodes: at full scale with the script's own
call (bit-identical), or at 1/2, 1/4, 1/8 in libjpeg-turbo's DCT (simplejpeg) when the
output keeps at least one source pixel per output pixel at that scale. A stand-in the
script changed before its pipeline (a dtype conversion, a crop) raises `Deferred.Changed`,
and the sample (and every later one) is read again with the decoders left alone.

PIL's ``Image.open`` is not deferred: a PIL image is decoded in full by its first use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

_JPEG = b"\xff\xd8\xff"


class Deferred:
    """The stand-ins handed out in one ``dataset[i]`` call and how to decode each."""

    class Changed(Exception):
        """The script changed a stand-in before its pipeline: decode for real instead."""

    def __init__(self) -> None:
        self.pending: dict[int, tuple[torch.Tensor, bytes, Callable[[], torch.Tensor]]] = {}

    def add(self, stand_in: torch.Tensor, data: bytes, decode: Callable[[], torch.Tensor]) -> None:
        self.pending[stand_in.data_ptr()] = (stand_in, data, decode)

    def take(self, image: torch.Tensor) -> tuple[bytes, Callable[[], torch.Tensor]] | None:
        """The bytes and full decode of ``image`` if it is a stand-in as handed out; raises
        `Changed` where stand-ins are out and ``image`` is not one of them."""
        if not self.pending:
            return None
        entry = self.pending.pop(image.data_ptr(), None)
        if entry is None or entry[0].shape != image.shape or entry[0].stride() != image.stride():
            raise Deferred.Changed("the dataset changed its decoded image before its pipeline")
        return entry[1], entry[2]


def _header(data: torch.Tensor) -> tuple[bytes, int, int] | None:
    """``(bytes, height, width)`` of a 3-channel JPEG in a 1-D uint8 tensor, else None."""
    import simplejpeg

    if not isinstance(data, torch.Tensor) or data.dtype != torch.uint8 or data.dim() != 1:
        return None
    raw = data.numpy().tobytes()
    if raw[:3] != _JPEG:
        return None
    try:
        height, width, colorspace, _ = simplejpeg.decode_jpeg_header(raw)
    except ValueError:
        return None
    if colorspace not in ("YCbCr", "RGB") or height <= 0 or width <= 0:
        return None
    return raw, height, width


def _deferring(original: Callable[..., Any], deferred: Deferred, reads_path: bool) -> Callable:
    from torchvision.io import ImageReadMode, read_file

    def decode(source: Any, mode: Any = ImageReadMode.UNCHANGED, *args: Any, **kw: Any) -> Any:
        plain = mode in (ImageReadMode.UNCHANGED, ImageReadMode.RGB) and not args
        plain = plain and not kw.get("apply_exif_orientation") and kw.get("device", "cpu") == "cpu"
        data = read_file(source) if reads_path or isinstance(source, str) else source
        found = _header(data) if plain else None
        if found is None:
            return original(data if not reads_path else source, mode, *args, **kw)
        raw, height, width = found
        stand_in = torch.empty((3, height, width), dtype=torch.uint8)
        deferred.add(stand_in, raw, lambda: original(data, mode, *args, **kw))
        return stand_in

    return decode


@contextlib.contextmanager
def intercept(cls: type, deferred: Deferred) -> Iterator[None]:
    """Within the block, ``torchvision.io``'s JPEG decoders defer (see the module's
    docstring), as ``torchvision.io`` attributes and as names in ``cls``'s module."""
    import sys

    import torchvision.io as tio

    originals = {
        "decode_jpeg": (tio.decode_jpeg, False),
        "decode_image": (tio.decode_image, False),
        "read_image": (tio.read_image, True),
    }
    patched = {n: _deferring(f, deferred, path) for n, (f, path) in originals.items()}
    namespaces = [vars(tio)]
    module = sys.modules.get(cls.__module__)
    if module is not None and module is not tio:
        namespaces.append(vars(module))
    saved: list[tuple[dict[str, Any], str, Any]] = []
    by_function = {id(f): n for n, (f, _) in originals.items()}
    for space in namespaces:
        for name, value in list(space.items()):
            hit = by_function.get(id(value))
            if hit is not None:
                saved.append((space, name, value))
                space[name] = patched[hit]
    try:
        yield
    finally:
        for space, name, value in saved:
            space[name] = value
