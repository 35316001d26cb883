"""`bench detection`: an SSD-style torchvision detection script, unchanged: as it is, and
under ``unstall run --config`` with ``{"kwargs": {"prep": "lean"}}`` (its pipeline planned).

The script is ``examples/detection_ssd.py`` (a Dataset of JPEGs read with
``decode_jpeg(read_file(path))``, boxes as ``BoundingBoxes``, a ``transforms.v2`` preset, a
list collate, 2 workers) with a simulated model that holds each batch ``STEP_MS`` (fast
enough that the job is prep-bound). Three presets, each its own row: ``ssd``
(``RandomPhotometricDistort + RandomZoomOut + RandomIoUCrop + RandomHorizontalFlip +
Resize((300, 300))``; goal >= 3x), ``ssdlite`` (the same without colours or zoom-out) and
``hflip`` (Faster R-CNN's: decode + flip, the model resizing on the GPU). Per preset, runs
as is and planned alternate in pairs; the ratio is the median of the pairs' ratios. Every
file is read once first, so no timed run reads from storage.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from unstall.bench import harness
from unstall.bench.harness import BenchResult, read_all

DESCRIPTION = (
    "an SSD-style torchvision detection script, unchanged: as is vs its v2 pipeline planned "
    "under unstall run (prep lean); goal >= 3x on the ssd preset"
)
SCRIPT = harness.EXAMPLES / "detection_ssd.py"
#: the simulated step: 16 samples per 4 ms, far above what 2 workers prepare
STEP_MS = 4.0
GOAL = 3.0
PRESETS = ("ssd", "ssdlite", "hflip")
#: images per run (1024x768 JPEGs, 1-10 boxes each)
IMAGES = {"quick": 48, "full": 192}
SIZE = (1024, 768)


def make_detection_data(
    root: str | os.PathLike, images: int, *, size: tuple[int, int] = SIZE, seed: int = 0
) -> Path:
    """``images`` JPEGs of ``size`` (width, height) under ``root``, each with 1-10 boxes
    (XYXY, inside the image, at least 8 pixels a side) and labels 1-90 in
    ``annotations.json``: a function of (images, size, seed) only; kept if already there."""
    from unstall.data.synthetic import render_image

    root = Path(root)
    index = root / "annotations.json"
    if index.exists():
        return root
    root.mkdir(parents=True, exist_ok=True)
    width, height = size
    items = []
    for i in range(images):
        rng = np.random.default_rng([seed, i, 7])
        name = f"{i:06d}.jpg"
        (root / name).write_bytes(render_image(seed, i, classes=10, size=size))
        n = int(rng.integers(1, 11))
        x0 = rng.uniform(0, width - 16, n)
        y0 = rng.uniform(0, height - 16, n)
        x1 = np.minimum(x0 + rng.uniform(8, width / 2, n), width)
        y1 = np.minimum(y0 + rng.uniform(8, height / 2, n), height)
        boxes = np.stack([x0, y0, x1, y1], 1).round(2).tolist()
        labels = rng.integers(1, 91, n).tolist()
        items.append({"file": name, "boxes": boxes, "labels": labels})
    tmp = index.with_suffix(".tmp")
    tmp.write_text(json.dumps({"images": items}))
    tmp.replace(index)
    return root


def side_by_side(
    root: Path, images: int = 24, presets: tuple[str, ...] = PRESETS
) -> list[dict[str, Any]]:
    """Per preset, on ``images`` of the bench's JPEGs, in this process, one thread: CPU ms per
    sample of the script's ``dataset[i]`` and of the planned one (load-free: thread time),
    and the planned output's difference from torchvision's for the same draws (same seed):
    grey levels of 255, the mean over images of each image's mean, and the worst pixel. A
    pipeline ``prep="lean"`` leaves as it is (``left_as_is``: why) is timed planned all the
    same: what the plan would have cost there."""
    import importlib.util

    import torch

    from unstall.adapt.detection import Found, find_detection, planned_dataset
    from unstall.adapt.recognize import Refusal

    spec = importlib.util.spec_from_file_location("detection_ssd", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a loader worker
    rows = []
    try:
        for preset in presets:
            dataset = script.JpegBoxes(str(root), transforms=script.preset(preset, 300))
            found = find_detection(dataset)
            refused = found.reason if isinstance(found, Refusal) else None
            if refused is not None:  # left as it is by prep="lean": planned anyway
                found = find_detection(dataset, even_idle=True)
            assert isinstance(found, Found), f"{preset}: no plannable pipeline ({found})"
            planned = planned_dataset(dataset, found)
            own = ours = 0.0
            means, worst, boxes_equal = [], 0.0, True
            n = min(images, len(dataset))
            for i in range(n):
                torch.manual_seed(i)
                c0 = time.thread_time()
                a, ta = dataset[i]
                c1 = time.thread_time()
                torch.manual_seed(i)
                b, tb = planned[i]
                c2 = time.thread_time()
                own, ours = own + c1 - c0, ours + c2 - c1
                d = (a.float() - b.float()).abs() * 255
                means.append(float(d.mean()))
                worst = max(worst, float(d.max()))
                boxes_equal &= torch.equal(ta["boxes"], tb["boxes"])
                boxes_equal &= torch.equal(ta["labels"], tb["labels"])
            rows.append(
                {
                    "preset": preset,
                    "script_cpu_ms": round(own / n * 1e3, 2),
                    "planned_cpu_ms": round(ours / n * 1e3, 2),
                    "cpu_ratio": round(own / ours, 2),
                    "pixel_mean": round(sum(means) / n, 3),
                    "pixel_worst_image_mean": round(max(means), 3),
                    "pixel_worst": round(worst, 1),
                    "boxes_labels_equal": boxes_equal,
                    **({"left_as_is": refused} if refused else {}),
                }
            )
    finally:
        torch.set_num_threads(threads)
    return rows


def run(
    *,
    quick: bool,
    console: Any = None,
    repeats: int | None = None,
    images: int | None = None,
    presets: tuple[str, ...] = PRESETS,
    size: tuple[int, int] = SIZE,
) -> BenchResult:
    """``presets``: the rows (``ssd`` first: the headline); ``images`` and ``size`` (width,
    height) the JPEGs' count and size (the tests run a few small ones)."""
    import torchvision  # noqa: F401  (the script needs it; say so before anything runs)

    harness.check_example(SCRIPT, "detection")
    if presets[:1] != ("ssd",) or not set(presets) <= set(PRESETS):
        raise ValueError(f"presets={presets!r}: ssd first, then any of {PRESETS}")
    repeats = repeats or (1 if quick else 3)
    images = images or IMAGES["quick" if quick else "full"]
    say = console.print if console is not None else (lambda *_: None)
    env = harness.script_env()
    py = sys.executable
    rows: list[dict[str, Any]] = []
    ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="unstall-bench-det-") as tmp:
        data = make_detection_data(os.path.join(tmp, "data"), images, size=size)
        read_all(data)
        compared = side_by_side(data, images=min(24, images), presets=presets)
        for r in compared:
            say(
                f"  {r['preset']}: CPU per sample {r['script_cpu_ms']:.1f} ms as is, "
                f"{r['planned_cpu_ms']:.1f} ms planned ({r['cpu_ratio']:.2f}x); pixels vs "
                f"torchvision, same draws: mean {r['pixel_mean']:.2f}, worst image mean "
                f"{r['pixel_worst_image_mean']:.2f}, worst {r['pixel_worst']:.0f} grey levels; "
                f"boxes and labels equal: {r['boxes_labels_equal']}"
                + (f"; left as it is by prep='lean' ({r['left_as_is']})" if _idle(r) else "")
            )
        config = os.path.join(tmp, "lean.json")
        with open(config, "w") as f:
            json.dump({"kwargs": {"prep": "lean"}}, f)
        for preset in presets:
            script = [str(SCRIPT), str(data), "--preset", preset, "--workers", "2"]
            script += ["--batch-size", "16", "--step-ms", str(STEP_MS), "--epochs", "1"]
            plain, under = [py, *script], harness.under_unstall(config, [py, *script])

            def said(i: int, a: float, b: float, preset: str = preset) -> None:
                say(
                    f"  {preset} pair {i + 1}/{repeats}: as is {a:.1f} samples/s, planned "
                    f"{b:.1f} ({b / a:.2f}x)"
                )

            pairs = harness.run_pairs(
                lambda plain=plain: harness.run_script(plain, env, timeout=1200).samples_per_s(),
                lambda under=under: harness.run_script(under, env, timeout=1200).samples_per_s(),
                repeats,
                rate=float,
                on_pair=said,
            ).rates
            ratios[preset] = pairs.ratio
            rows.append(
                {
                    "case": preset,
                    "as_is_samples_per_s": round(pairs.base_median, 1),
                    "planned_samples_per_s": round(pairs.new_median, 1),
                    "as_is_runs": [round(v, 1) for v in pairs.base],
                    "planned_runs": [round(v, 1) for v in pairs.new],
                    "pair_ratios": [round(r, 3) for r in pairs.ratios],
                    "ratio": round(ratios[preset], 3),
                }
            )
            say(f"  {preset}: median of the pairs' ratios {ratios[preset]:.2f}x")
    ssd = rows[0]
    return BenchResult(
        name="detection",
        ratio=ratios["ssd"],
        baseline={
            "command": "python examples/detection_ssd.py DATA --preset ssd",
            "samples_per_s": ssd["as_is_samples_per_s"],
        },
        unstall={
            "command": "unstall run --config lean.json -- python examples/detection_ssd.py ...",
            "kwargs": {"prep": "lean"},
            "samples_per_s": ssd["planned_samples_per_s"],
        },
        rows=rows,
        detail={
            "goal": GOAL,
            "repeats": repeats,
            "images": images,
            "image_size": f"{size[0]}x{size[1]}",
            "step_ms": STEP_MS,
            "ratios": {k: round(v, 3) for k, v in ratios.items()},
            "side_by_side": compared,
        },
        notes=[
            f"{repeats} alternating pairs per preset, one epoch of {images} JPEGs of "
            f"{size[0]}x{size[1]} (1-10 boxes each), batch 16, 2 workers, a simulated step of "
            f"{STEP_MS} ms; ratio: the median of the pairs' ratios (goal >= {GOAL}x on ssd)",
            "ratios: " + ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items()),
            "load-free (CPU per sample, one thread, side by side): "
            + "; ".join(
                f"{r['preset']} {r['script_cpu_ms']:.1f} -> {r['planned_cpu_ms']:.1f} ms "
                f"({r['cpu_ratio']:.2f}x)"
                for r in compared
            ),
            *(
                f'{r["preset"]}: prep="lean" leaves the pipeline as it is ({r["left_as_is"]}), '
                "so its end-to-end pair runs the script as it is on both sides; the side-by-side "
                "figure times the plan all the same"
                for r in compared
                if _idle(r)
            ),
        ],
    )


def _idle(row: dict[str, Any]) -> bool:
    """Whether ``prep="lean"`` leaves that side-by-side row's pipeline as it is."""
    return bool(row.get("left_as_is"))
