"""`bench torchvision`: the usual torchvision ImageFolder script, unchanged: as it is, and under
``unstall run`` with the analyzer's recommendation.

The script is ``examples/torchvision_imagefolder.py`` (``ImageFolder`` +
``RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize``, float32 batches made
by 2 workers, ``.to(device)`` in the loop) with a simulated model that holds each batch
``--step-ms`` (fast enough that the job is prep-bound). First ``unstall analyze --quick``
runs it and writes its recommendation (``recommendation.json``); every file is then read once,
so that no timed run reads from storage (the analyzer's cold run evicts files from the page
cache), and the script runs as it is and under ``unstall run --config
recommendation.json``, in pairs alternating which goes first. The headline ratio is the median
of the pairs' ratios (samples/s under the recommendation over samples/s as it is; goal >= 2),
both sides' medians are given too.

The rates are wall-clock ones, so a machine shared with other jobs moves them: each run also
records the cores other processes kept busy during it (``/proc/stat``'s busy time less this
run's own), and the analyzer's lean probe gives the load-free figure the ratio rests on on a
prep-bound machine: CPU per sample of the script's ``dataset[i]`` against unstall's.
`cpu_by_size` times the two transforms on larger JPEGs too: what the ratio becomes where
unstall's reduced-scale DCT decode applies (a 224 crop of a 500x375 image never allows it).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from unstall import machine
from unstall.bench import harness
from unstall.bench.harness import BenchResult, read_all

DESCRIPTION = (
    "a torchvision ImageFolder script, unchanged: as is vs under unstall run with the "
    "analyzer's recommendation (goal >= 2x samples/s)"
)
SCRIPT = harness.EXAMPLES / "torchvision_imagefolder.py"
#: the simulated model's step: 32 samples per 8 ms (4,000 samples/s), far above 2 workers' prep
STEP_MS = 8.0
GOAL = 2.0
#: Images per epoch: enough that the loader's start-up (forking workers, the first batch) is
#: a small part of each run, as in a real epoch, at ~500x375 (`ensure_demo_dataset`).
IMAGES = {"quick": 2048, "full": 4096}


def _lean_probe(report_path: str) -> dict[str, float] | None:
    """The analyzer's lean probe: CPU ms per sample of the script's ``dataset[i]`` and of
    unstall's pipeline on the same files, timed side by side in the script's process."""
    try:
        with open(report_path) as f:
            report = json.load(f)
        lean = next(r for r in report["remedies"] if r["remedy"] == "lean")
        probe = lean["probe"]
        own, ours = probe["own_cpu_s"] * 1e3, probe["lean_cpu_s"] * 1e3
    except (OSError, ValueError, KeyError, StopIteration, TypeError):
        return None
    return {"own_cpu_ms": round(own, 3), "lean_cpu_ms": round(ours, 3), "ratio": own / ours}


#: Image sizes (width, height) `cpu_by_size` times both pipelines on: the bench's, then larger
#: ones, where a 224 crop is often at least twice the output and unstall decodes it at 1/2 or
#: 1/4 scale in the DCT.
SIZES = ((500, 375), (1024, 768), (1600, 1200))


def cpu_by_size(images: int = 12) -> list[dict[str, Any]]:
    """CPU ms per sample of the script's transform (PIL decode + ``RandomResizedCrop(224) +
    RandomHorizontalFlip + ToTensor + Normalize``) and of unstall's (`ImagePipeline`, float
    output, as ``prep="lean"`` runs it without a GPU), one thread, on ``images`` JPEGs of each
    of `SIZES`, two kinds each: ``grain`` (rendered at that size, the bench's texture: fine
    noise, whose entropy decoding no DCT scale saves) and ``smooth`` (the bench's 500x375
    image upscaled bicubic, as photos scaled down by a camera are smoother than noise)."""
    import io

    import torch
    from PIL import Image
    from torchvision import transforms

    from unstall.data.synthetic import render_image
    from unstall.pipeline import ImagePipeline
    from unstall.pipeline.crop import dct_scale

    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    theirs = transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize(mean, std),
        ]
    )
    ours = ImagePipeline(224, output="float", mean=mean, std=std, seed=0)

    def script(data: bytes) -> Any:
        with Image.open(io.BytesIO(data)) as image:
            return theirs(image.convert("RGB"))

    def cpu_ms(fn: Any, files: list[bytes]) -> float:
        fn(files[0])  # warm
        c0 = time.thread_time()
        for data in files:
            fn(data)
        return (time.thread_time() - c0) / len(files) * 1e3

    def jpeg(image: Image.Image) -> bytes:
        out = io.BytesIO()
        image.save(out, "JPEG", quality=90)
        return out.getvalue()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in a loader worker
    torch.manual_seed(0)
    rows = []
    try:
        bases = [render_image(0, i, classes=10, size=SIZES[0]) for i in range(images)]
        for size in SIZES:
            kinds = {
                "grain": [render_image(0, i, classes=10, size=size) for i in range(images)],
                "smooth": [
                    jpeg(Image.open(io.BytesIO(b)).convert("RGB").resize(size, Image.BICUBIC))
                    for b in bases
                ],
            }
            for kind, files in kinds.items():
                if size == SIZES[0] and kind == "smooth":
                    continue  # the same images as grain
                a, b = cpu_ms(script, files), cpu_ms(ours, files)
                reduced = sum(dct_scale(ours.draw(f)[0], ours.size) > 1 for f in files * 4)
                rows.append(
                    {
                        "size": f"{size[0]}x{size[1]}",
                        "kind": kind,
                        "kb": round(sum(map(len, files)) / len(files) / 1e3),
                        "script_ms": round(a, 2),
                        "lean_ms": round(b, 2),
                        "ratio": round(a / b, 2),
                        "reduced_dct": round(reduced / (4 * len(files)), 2),
                    }
                )
    finally:
        torch.set_num_threads(threads)
    return rows


def run(
    *, quick: bool, console: Any = None, repeats: int | None = None, images: int | None = None
) -> BenchResult:
    import torchvision  # noqa: F401  (the script needs it; say so before anything runs)

    from unstall.data.synthetic import ensure_demo_dataset

    harness.check_example(SCRIPT, "torchvision")
    repeats = repeats or (5 if quick else 7)
    images = images or IMAGES["quick" if quick else "full"]
    data = os.fspath(ensure_demo_dataset(images=images, classes=10, seed=0, progress=False))
    env = harness.script_env()
    script = [SCRIPT.as_posix(), data, "--workers", "2", "--batch-size", "32"]
    script += ["--step-ms", str(STEP_MS), "--epochs", "1"]
    py = sys.executable
    say = console.print if console is not None else (lambda *_: None)
    by_size = cpu_by_size()  # in this process, before any run: nothing else of the bench's
    for r in by_size:
        say(
            f"  CPU per sample, {r['size']} {r['kind']} JPEGs ({r['kb']} KB, "
            f"{r['reduced_dct']:.0%} of crops decoded at a reduced DCT scale): as is "
            f"{r['script_ms']:.2f} ms, lean {r['lean_ms']:.2f} ms ({r['ratio']:.2f}x)"
        )
    with tempfile.TemporaryDirectory(prefix="unstall-bench-tv-") as tmp:
        config, report = os.path.join(tmp, "recommendation.json"), os.path.join(tmp, "report.json")
        say("  unstall analyze --quick (the recommendation)")
        analyze = [py, "-m", "unstall", "analyze", "--quick", "--no-verify", "--html", tmp]
        analyze += ["--config-out", config, "--json", report, "--"]
        done = subprocess.run(
            [*analyze, py, *script], env=env, capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"unstall analyze failed: {done.stdout[-1500:]}{done.stderr[-1500:]}"
            )
        with open(config) as f:
            recommended = json.load(f)
        probe = _lean_probe(report)
        if probe is not None:
            say(
                f"  the analyzer's probe: {probe['own_cpu_ms']:.2f} ms of CPU per sample as is, "
                f"{probe['lean_cpu_ms']:.2f} ms lean ({probe['ratio']:.2f}x less)"
            )
        read_all(data)  # in the page cache before any timed run (the analyzer evicts files)
        plain, under = [py, *script], harness.under_unstall(config, [py, *script])

        def said(i: int, a: harness.ScriptRun, b: harness.ScriptRun) -> None:
            x, y = a.samples_per_s(), b.samples_per_s()
            say(
                f"  pair {i + 1}/{repeats}: as is {x:.1f} samples/s, recommended "
                f"{y:.1f} ({y / x:.2f}x); "
                f"other processes used {a.others_cores:.1f} and {b.others_cores:.1f} cores"
            )

        runs = harness.run_pairs(
            lambda: harness.run_script(plain, env, timeout=600),
            lambda: harness.run_script(under, env, timeout=600),
            repeats,
            rate=harness.ScriptRun.samples_per_s,
            on_pair=said,
        )
    s = runs.rates
    as_is, applied = s.base, s.new
    others_by_side = {
        "as_is": [r.others_cores for r in runs.base],
        "applied": [r.others_cores for r in runs.new],
    }
    others = [v for side in others_by_side.values() for v in side]
    say(
        f"  medians: as is {s.base_median:.1f} samples/s, recommended {s.new_median:.1f}; "
        f"median of the pairs' ratios {s.ratio:.2f}x, ratio of the medians "
        f"{s.ratio_of_medians:.2f}x (goal {GOAL}x)"
    )
    kwargs = recommended.get("kwargs", {})
    return BenchResult(
        name="torchvision",
        ratio=s.ratio,
        baseline={
            "command": "python examples/torchvision_imagefolder.py",
            "samples_per_s": s.base_median,
        },
        unstall={
            "command": "unstall run --config recommendation.json -- python ...",
            "kwargs": kwargs,
            "samples_per_s": s.new_median,
        },
        rows=[
            {
                "case": "as is (torchvision transforms, 2 workers)",
                "samples_per_s": round(s.base_median, 1),
                "runs": [round(v, 1) for v in as_is],
            },
            {
                "case": f"under unstall run, config {json.dumps(kwargs)}",
                "samples_per_s": round(s.new_median, 1),
                "runs": [round(v, 1) for v in applied],
                "ratio": round(s.ratio, 3),
            },
        ],
        detail={
            "goal": GOAL,
            "repeats": repeats,
            "images": images,
            "step_ms": STEP_MS,
            "ratio_of_medians": round(s.ratio_of_medians, 4),
            "pair_ratios": [round(r, 3) for r in s.ratios],
            "others_cores": {k: [round(r, 2) for r in v] for k, v in others_by_side.items()},
            "lean_probe": probe,
            "cpu_by_size": by_size,
        },
        notes=[
            f"{repeats} alternating pairs of runs, one epoch of {images} images (~500x375 "
            f"JPEGs) each, batch 32, 2 workers, a simulated step of {STEP_MS} ms; the config "
            "is what `unstall analyze --quick` recommended for the unchanged script in the same "
            "run; ratio: the median of the pairs' ratios (goal >= 2x)",
            "pairs' ratios, in run order: " + ", ".join(f"{r:.2f}" for r in s.ratios),
            f"cores other processes kept busy during the runs: median "
            f"{statistics.median(others):.2f}, most {max(others):.2f} (of the machine's "
            f"{machine.cpus_installed()})",
        ]
        + (
            [
                f"the analyzer's probe (load-free: CPU per sample, side by side): "
                f"{probe['own_cpu_ms']:.2f} ms as is, {probe['lean_cpu_ms']:.2f} ms lean, "
                f"{probe['ratio']:.2f}x: what the ratio tends to where the workers' cores are "
                "the limit"
            ]
            if probe
            else []
        )
        + [
            "CPU ms per sample as is -> lean, one thread, by image size (`cpu_by_size`): "
            + "; ".join(
                f"{r['size']} {r['kind']} {r['script_ms']:.1f} -> {r['lean_ms']:.1f} "
                f"({r['ratio']:.2f}x, {r['reduced_dct']:.0%} reduced)"
                for r in by_size
            )
        ],
    )
