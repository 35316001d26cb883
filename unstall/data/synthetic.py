"""Synthetic image datasets: realistic ~500x375, ~75 KB JPEGs in ImageFolder layout.

Image ``i`` depends only on ``(seed, i)`` (and its class on ``i % classes``), so the
bytes are the same whatever the number of workers, and a run can be resumed.
Content is a gradient, random shapes and noise texture: it costs what a photo
costs to decode, unlike flat colour that compresses to nothing.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from multiprocessing.pool import Pool
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from unstall import machine
from unstall.errors import MissingKeyError
from unstall.stores import LocalStore, Store, open_store

MANIFEST = "unstall-dataset.json"
#: Bump when the images a (seed, index) produces change: old datasets are then rejected.
RECIPE_VERSION = 1
# (width, height, probability): mostly landscape 4:3, like ImageNet photos.
_SHAPES = ((500, 375, 0.7), (375, 500, 0.15), (500, 333, 0.15))
_SHAPE_CDF = np.cumsum([p for _, _, p in _SHAPES])[:-1]
_CHUNK = 16


@dataclass(frozen=True)
class Written:
    """What `write_missing` did: where, how many written and skipped, their bytes
    [Unit: byte, second]."""

    root: str
    written: int
    skipped: int
    total_bytes: int
    sized: int
    seconds: float

    @property
    def mean_bytes(self) -> float:
        """Mean file size over the ``sized`` items (all of them, in a local directory)."""
        return self.total_bytes / self.sized if self.sized else 0.0


@dataclass(frozen=True)
class SyntheticInfo(Written):
    """What `make_dataset` wrote: where, how many images, how big."""

    images: int = 0
    classes: int = 0


def image_key(index: int, *, images: int, classes: int) -> str:
    """The key of image ``index``: ``class_XXX/img_XXXXXX.jpg``, class ``index % classes``."""
    cw, iw = max(3, len(str(classes - 1))), max(6, len(str(images - 1)))
    return f"class_{index % classes:0{cw}d}/img_{index:0{iw}d}.jpg"


def render_image(
    seed: int, index: int, *, classes: int, quality: int = 90, size: tuple[int, int] | None = None
) -> bytes:
    """The JPEG bytes of image ``index``: a function of (seed, index, classes, quality) only.
    ``size``: ``(width, height)`` instead of the drawn shape (the same texture at any size)."""
    rng = np.random.default_rng([seed, index])
    palette = np.random.default_rng([seed, 1_000_003, index % classes])
    width, height = _SHAPES[int(np.searchsorted(_SHAPE_CDF, rng.random(), side="right"))][:2]
    if size is not None:
        width, height = size
    colors = palette.integers(0, 256, (2, 3)) * 0.6 + rng.integers(0, 256, (2, 3)) * 0.4
    angle = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(angle) * np.arange(width, dtype=np.float32) / width)[None, :] + (
        np.sin(angle) * np.arange(height, dtype=np.float32) / height
    )[:, None]
    ramp = (ramp - ramp.min()) / (np.ptp(ramp) + 1e-6)
    pixels = colors[0] * (1 - ramp[..., None]) + colors[1] * ramp[..., None]
    canvas = Image.fromarray(pixels.astype(np.uint8))
    draw = ImageDraw.Draw(canvas)
    for _ in range(int(rng.integers(6, 16))):
        kind, color = int(rng.integers(0, 3)), tuple(int(c) for c in rng.integers(0, 256, 3))
        x0, y0 = int(rng.integers(-50, width)), int(rng.integers(-50, height))
        x1, y1 = x0 + int(rng.integers(20, width // 2)), y0 + int(rng.integers(20, height // 2))
        if kind == 0:
            draw.ellipse([x0, y0, x1, y1], fill=color)
        elif kind == 1:
            draw.rectangle([x0, y0, x1, y1], fill=color)
        else:
            xs, ys = rng.integers(0, width, 3), rng.integers(0, height, 3)
            draw.polygon([(int(x), int(y)) for x, y in zip(xs, ys, strict=True)], fill=color)
    array = np.asarray(canvas, dtype=np.float32)
    # texture: coarse blotches (upsampled noise) plus fine grain; grain sets the file size
    coarse = rng.normal(0, 18, (height // 8 + 1, width // 8 + 1)).astype(np.float32)
    array += np.asarray(Image.fromarray(coarse).resize((width, height), Image.BILINEAR))[..., None]
    array += rng.standard_normal(array.shape, dtype=np.float32) * np.float32(rng.uniform(9.5, 13.5))
    out = io.BytesIO()
    Image.fromarray(np.clip(array, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=quality)
    return out.getvalue()


def make_dataset(
    dest: str | os.PathLike[str] | Store,
    *,
    images: int,
    classes: int,
    seed: int = 0,
    workers: int | None = None,
    quality: int = 90,
    progress: bool = True,
) -> SyntheticInfo:
    """Write ``images`` synthetic JPEGs in ``classes`` ImageFolder classes to ``dest``.

    ``dest`` is a directory (created if missing) or any URL `open_store` accepts. A
    manifest (``unstall-dataset.json``) records the parameters: re-running with the
    same ones skips images already there; different ones raise, naming the parameter.
    With ``workers > 1`` each process writes through its own copy of the store, so a
    `Store` passed in must reach shared storage (a directory, a bucket).

    Raises:
        ValueError: a bad parameter, or ``dest`` holds a dataset made with other ones.
    """
    params = _check_params(images=images, classes=classes, seed=seed, quality=quality)
    keys = [image_key(i, images=images, classes=classes) for i in range(images)]
    written = write_missing(
        dest, params, keys, _write_chunk, workers=workers, progress=progress, what="images"
    )
    return SyntheticInfo(images=images, classes=classes, **written)


def write_missing(
    dest: str | os.PathLike[str] | Store,
    params: dict[str, Any],
    keys: list[str],
    write_chunk: Callable[[tuple[Store, dict[str, Any], list[int]]], tuple[int, int]],
    *,
    workers: int | None,
    progress: bool,
    what: str,
    chunk: int = _CHUNK,
) -> dict[str, Any]:
    """Write the items of ``keys`` that ``dest`` lacks, ``chunk`` indices per call of
    ``write_chunk((store, params, indices)) -> (count, bytes)``, in ``workers`` processes
    (default one per core), after claiming ``dest`` for ``params`` (its manifest); the
    fields of `Written` as a dict. The synthetic datasets' one writing loop."""
    if workers is None:
        workers = min(machine.cores_available(), max(1, len(keys) // chunk))
    if workers < 1:
        raise ValueError(f"workers={workers!r} must be >= 1 (or None for one per core)")
    if isinstance(dest, (str, os.PathLike)) and "://" not in os.fspath(dest):
        Path(dest).expanduser().mkdir(parents=True, exist_ok=True)
    store = open_store(dest)
    _claim(store, params)
    existing = set(store.list())
    todo = [i for i, key in enumerate(keys) if key not in existing]
    start = time.perf_counter()
    jobs = [(store, params, todo[k : k + chunk]) for k in range(0, len(todo), chunk)]
    written = 0
    # the pool forks before the progress bar starts its refresh thread
    with (
        _pool(workers, len(jobs)) as pool,
        _progress(progress, total=len(todo), what=what) as advance,
    ):
        results = pool.imap_unordered(write_chunk, jobs) if pool else map(write_chunk, jobs)
        for count, nbytes in results:
            written += nbytes
            advance(count)
    skipped = [key for key in keys if key in existing]
    sized = skipped if isinstance(store, LocalStore) else []
    return asdict(
        Written(
            root=store.url,
            written=len(todo),
            skipped=len(skipped),
            total_bytes=written + sum(store.path(key).stat().st_size for key in sized),
            sized=len(todo) + len(sized),
            seconds=time.perf_counter() - start,
        )
    )


def ensure_demo_dataset(
    cache_dir: str | os.PathLike[str] | None = None,
    images: int = 2048,
    classes: int = 10,
    seed: int = 0,
    *,
    progress: bool = True,
) -> Path:
    """The path of a synthetic dataset in the cache, made the first time it is asked for.

    ``cache_dir`` defaults to ``$UNSTALL_CACHE_DIR`` or ``~/.cache/unstall``; the
    dataset lives in ``<cache_dir>/datasets/synthetic-<images>x<classes>-seed<seed>``.
    """
    base = cache_dir or machine.cache_dir()
    path = Path(base).expanduser() / "datasets" / f"synthetic-{images}x{classes}-seed{seed}"
    make_dataset(path, images=images, classes=classes, seed=seed, progress=progress)
    return path


def _check_params(*, images: int, classes: int, seed: int, quality: int) -> dict[str, int]:
    checks = {
        "images": (images, images >= 1, "at least 1"),
        "classes": (classes, 1 <= classes <= max(images, 1), "between 1 and images"),
        "seed": (seed, seed >= 0, "a non-negative int"),
        "quality": (quality, 1 <= quality <= 100, "a JPEG quality between 1 and 100"),
    }
    for name, (value, ok, want) in checks.items():
        if not isinstance(value, int) or isinstance(value, bool) or not ok:
            raise ValueError(f"{name}={value!r} must be {want}")
    return {
        "recipe": RECIPE_VERSION,
        "images": images,
        "classes": classes,
        "seed": seed,
        "quality": quality,
    }


def _claim(store: Store, params: dict[str, Any]) -> None:
    """Check the manifest in ``store`` matches ``params``, or write one if there is none."""
    try:
        found = json.loads(store.get(MANIFEST))
    except MissingKeyError:
        store.put(MANIFEST, json.dumps(params, indent=2, sort_keys=True).encode())
        return
    for name, value in params.items():
        if found.get(name) != value:
            raise ValueError(
                f"{store.url!r} holds a synthetic dataset made with {name}={found.get(name)!r}, "
                f"not {name}={value!r}: use another directory, or delete it to re-create"
            )


def _write_chunk(job: tuple[Store, dict[str, int], list[int]]) -> tuple[int, int]:
    store, p, indices = job
    nbytes = 0
    for i in indices:
        data = render_image(p["seed"], i, classes=p["classes"], quality=p["quality"])
        store.put(image_key(i, images=p["images"], classes=p["classes"]), data)
        nbytes += len(data)
    return len(indices), nbytes


def _pool(workers: int, jobs: int) -> contextlib.AbstractContextManager[Pool | None]:
    if workers == 1 or jobs <= 1:
        return contextlib.nullcontext()
    return multiprocessing.get_context().Pool(min(workers, jobs))


@contextlib.contextmanager
def _progress(
    enabled: bool, *, total: int, what: str = "images"
) -> Iterator[Callable[[int], object]]:
    """A rich progress bar ("writing <what>") or nothing, yielding ``advance(n)``."""
    if not enabled or total == 0:
        yield lambda n: None
        return
    from rich.progress import Progress

    with Progress() as bar:
        task = bar.add_task(f"writing {what}", total=total)
        yield lambda n: bar.update(task, advance=n)
