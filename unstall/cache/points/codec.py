"""A prepared sample as bytes and back, exactly: what the sample and decoded caches store.

No ``torch.save``: a sample is a small header (a JSON description of its structure) and
the raw buffers of its arrays, back to back. Handled exactly: ``None``, bools, ints,
floats, strings, bytes, tuples, lists, dicts, `torch.Tensor` (plain tensors), numpy
arrays of numeric dtypes and PIL images of the plain modes. Anything else (a tensor
subclass, an object array, a palette image) is pickled, still exactly.

Compact where the values allow it, and only then: a floating tensor or array whose
values are all whole numbers in 0-255 is stored as uint8 (an image's pixels), and one
whose values are all k/32768 for an int16 k is stored as int16 (audio decoded from
16-bit samples), with a note of the dtype to give back. Decoding multiplies back in the
original dtype, which is exact for both (a power-of-two scale), so the sample served is
bit-identical; a negative zero, a NaN or an infinity keeps the array as it is.
"""

from __future__ import annotations

import json
import pickle
import struct
from typing import Any

import numpy as np

#: The format's tag; part of the preparation fingerprint (a new format: new entries).
MAGIC = b"USMP1"
#: Arrays smaller than this are not worth a compactness test.
_COMPACT_MIN = 64
#: PIL modes whose pixels are exactly their ``tobytes()``.
_PIL_MODES = ("1", "L", "LA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "I", "F", "I;16")


def encode(sample: Any) -> bytes:
    """``sample`` as bytes that `decode` gives back exactly."""
    buffers: list[bytes] = []
    spec = _spec(sample, buffers)
    head = json.dumps(spec, separators=(",", ":")).encode()
    sizes = struct.pack(f"<{len(buffers)}Q", *(len(b) for b in buffers))
    return b"".join([MAGIC, struct.pack("<II", len(head), len(buffers)), head, sizes, *buffers])


def decode(data: bytes | memoryview) -> Any:
    """The sample `encode` made ``data`` from."""
    view = memoryview(data)
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise ValueError("not an encoded sample (bad magic)")
    pos = len(MAGIC)
    head_len, count = struct.unpack_from("<II", view, pos)
    pos += 8
    spec = json.loads(bytes(view[pos : pos + head_len]))
    pos += head_len
    sizes = struct.unpack_from(f"<{count}Q", view, pos)
    pos += 8 * count
    buffers = []
    for size in sizes:
        buffers.append(view[pos : pos + size])
        pos += size
    return _build(spec, buffers)


def compact_kind(sample: Any) -> str:
    """How the sample's arrays are stored: ``"uint8"``, ``"int16"``, ``"exact"`` or ``"mixed"``
    (for the stats: what the cache holds)."""
    buffers: list[bytes] = []
    kinds = set()

    def walk(spec: Any) -> None:
        if isinstance(spec, dict):
            if spec.get("t") in ("tensor", "ndarray"):
                kinds.add(spec.get("as", "exact"))
            for v in spec.values():
                walk(v)
        elif isinstance(spec, list):
            for v in spec:
                walk(v)

    walk(_spec(sample, buffers))
    if len(kinds) == 1:
        return kinds.pop()
    return "mixed" if kinds else "exact"


# Encoding -------------------------------------------------------------------------------
def _spec(x: Any, buffers: list[bytes]) -> Any:
    t = type(x)
    if x is None or t is bool or t is str:
        return {"t": "json", "v": x}
    if t is int:
        return {"t": "int", "v": str(x)}
    if t is float:
        return {"t": "float", "v": x.hex()}
    if t is bytes:
        buffers.append(x)
        return {"t": "bytes"}
    if t is tuple or t is list:
        return {"t": t.__name__, "v": [_spec(v, buffers) for v in x]}
    if t is dict:
        return {"t": "dict", "v": [[_spec(k, buffers), _spec(v, buffers)] for k, v in x.items()]}
    if t is np.ndarray and x.dtype.kind in "biufc":
        return _array_spec("ndarray", x, buffers)
    if isinstance(x, np.generic) and x.dtype.kind in "biufc":
        buffers.append(x.tobytes())
        return {"t": "npscalar", "dtype": x.dtype.str}
    torch = _torch()
    plain = torch is not None and t is torch.Tensor
    if plain and not x.requires_grad and x.layout == torch.strided:
        return _tensor_spec(x, buffers, torch)
    image = _pil_image()
    if image is not None and t is image and x.mode in _PIL_MODES:
        buffers.append(x.tobytes())
        spec = {"t": "pil", "mode": x.mode, "size": list(x.size)}
        if x.info:  # e.g. a JPEG's jfif fields: kept, as the image had them
            buffers.append(pickle.dumps(x.info, protocol=5))
            spec["info"] = True
        return spec
    buffers.append(pickle.dumps(x, protocol=5))
    return {"t": "pickle"}


def _array_spec(t: str, a: np.ndarray, buffers: list[bytes]) -> dict[str, Any]:
    a = np.ascontiguousarray(a)
    spec: dict[str, Any] = {"t": t, "dtype": a.dtype.str, "shape": list(a.shape)}
    small = _compact(a)
    if small is not None:
        spec["as"] = small.dtype.name
        a = small
    buffers.append(a.tobytes())
    return spec


def _tensor_spec(x: Any, buffers: list[bytes], torch: Any) -> dict[str, Any]:
    x = x.detach().cpu().contiguous()
    dtype = str(x.dtype).removeprefix("torch.")
    try:
        array = x.numpy()
    except TypeError:  # bfloat16, float8...: no numpy dtype
        buffers.append(pickle.dumps(x, protocol=5))
        return {"t": "pickle"}
    spec = _array_spec("tensor", array, buffers)
    spec["torch"] = dtype
    return spec


def _compact(a: np.ndarray) -> np.ndarray | None:
    """``a`` as uint8 or int16 when that holds every value exactly (module notes)."""
    if a.dtype.kind != "f" or a.size < _COMPACT_MIN or not np.isfinite(a).all():
        return None
    if (np.signbit(a) & (a == 0)).any():  # -0.0 would come back as 0.0
        return None
    if a.min() >= 0 and a.max() <= 255 and (np.rint(a) == a).all():
        return a.astype(np.uint8)
    scaled = a * a.dtype.type(32768)
    if np.abs(a).max() <= 1.0 and (np.rint(scaled) == scaled).all() and scaled.max() < 32768:
        return scaled.astype(np.int16)
    return None


# Decoding -------------------------------------------------------------------------------
def _build(spec: Any, buffers: list[memoryview]) -> Any:
    t = spec["t"]
    if t == "json":
        return spec["v"]
    if t == "int":
        return int(spec["v"])
    if t == "float":
        return float.fromhex(spec["v"])
    if t == "bytes":
        return bytes(buffers.pop(0))
    if t == "tuple":
        return tuple(_build(v, buffers) for v in spec["v"])
    if t == "list":
        return [_build(v, buffers) for v in spec["v"]]
    if t == "dict":
        return {_build(k, buffers): _build(v, buffers) for k, v in spec["v"]}
    if t in ("ndarray", "tensor"):
        a = _array(spec, buffers.pop(0))
        if t == "ndarray":
            return a
        torch = _torch()
        assert torch is not None
        return torch.from_numpy(a)
    if t == "npscalar":
        return np.frombuffer(buffers.pop(0), dtype=np.dtype(spec["dtype"]))[0]
    if t == "pil":
        from PIL import Image

        out = Image.frombytes(spec["mode"], tuple(spec["size"]), buffers.pop(0))
        if spec.get("info"):
            out.info = pickle.loads(buffers.pop(0))
        return out
    if t == "pickle":
        return pickle.loads(buffers.pop(0))
    raise ValueError(f"unknown sample part {t!r}")


def _array(spec: dict[str, Any], buf: memoryview) -> np.ndarray:
    dtype = np.dtype(spec["dtype"])
    shape = tuple(spec["shape"])
    small = spec.get("as")
    if small is None:
        return np.frombuffer(buf, dtype=dtype).reshape(shape).copy()
    stored = np.frombuffer(buf, dtype=np.dtype(small)).reshape(shape)
    out = stored.astype(dtype)
    if small == "int16":
        out *= dtype.type(1.0 / 32768)
    return out


def _torch() -> Any:
    import sys

    return sys.modules.get("torch")


def _pil_image() -> Any:
    import sys

    module = sys.modules.get("PIL.Image")
    return None if module is None else module.Image
