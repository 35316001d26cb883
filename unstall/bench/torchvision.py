"""`bench torchvision`: the usual torchvision ImageFolder script, unchanged: as it is, and under
``unstall run`` with the analyzer's recommendation.

The script is ``examples/torchvision_imagefolder.py`` (``ImageFolder`` +
``RandomResizedCrop(224) + RandomHorizontalFlip + ToTensor + Normalize``, float32 batches made
by 2 workers, ``.to(device)`` in the loop) with a simulated model that holds each batch
``--step-ms`` (fast enough that the job is prep-bound). First ``unstall analyze --quick``
runs it and writes its recommendation (``recommendation.json``); then the script runs as it
is and under ``unstall run --config recommendation.json``, in pairs alternating which goes
first; the ratio is the median of the pairs' ratios (samples/s under the recommendation over
samples/s as it is; goal >= 2). Each run reads the same files (the page cache holds them
after the first).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from unstall.bench.harness import BenchResult

DESCRIPTION = (
    "a torchvision ImageFolder script, unchanged: as is vs under unstall run with the "
    "analyzer's recommendation (goal >= 2x samples/s)"
)
SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "torchvision_imagefolder.py"
#: the simulated model's step: 32 samples per 8 ms (4,000 samples/s), far above 2 workers' prep
STEP_MS = 8.0
GOAL = 2.0


def _rate(command: list[str], env: dict[str, str], timeout: float) -> float:
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr[-2000:]}")
    found = re.findall(r"samples/s: ([0-9.]+)", done.stdout)
    if not found:
        raise RuntimeError(f"{' '.join(command)} printed no samples/s: {done.stdout[-500:]}")
    return float(found[-1])


def run(*, quick: bool, console: Any = None, repeats: int | None = None) -> BenchResult:
    import torchvision  # noqa: F401  (the script needs it; say so before anything runs)

    from unstall.data.synthetic import ensure_demo_dataset

    if not SCRIPT.exists():
        raise FileNotFoundError(f"bench torchvision runs {SCRIPT}: run it from a source checkout")
    repeats = repeats or (3 if quick else 5)
    images = 640 if quick else 1536
    data = os.fspath(ensure_demo_dataset(images=images, classes=10, seed=0, progress=False))
    env = dict(os.environ)
    env["PYTHONPATH"] = ":".join(filter(None, [str(SCRIPT.parents[1]), env.get("PYTHONPATH")]))
    script = [SCRIPT.as_posix(), data, "--workers", "2", "--batch-size", "32"]
    script += ["--step-ms", str(STEP_MS), "--epochs", "1"]
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="unstall-bench-tv-") as tmp:
        config = os.path.join(tmp, "recommendation.json")
        if console is not None:
            console.print("  unstall analyze --quick (the recommendation)")
        analyze = [py, "-m", "unstall", "analyze", "--quick", "--no-verify", "--html", tmp]
        analyze += ["--config-out", config, "--json", os.path.join(tmp, "report.json"), "--"]
        done = subprocess.run(
            [*analyze, py, *script], env=env, capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"unstall analyze failed: {done.stdout[-1500:]}{done.stderr[-1500:]}"
            )
        with open(config) as f:
            recommended = json.load(f)
        plain = [py, *script]
        under = [py, "-m", "unstall", "run", "--config", config, "--", py, *script]
        as_is: list[float] = []
        applied: list[float] = []
        for i in range(repeats):
            pair = ((plain, as_is), (under, applied))
            for command, out in pair if i % 2 == 0 else pair[::-1]:
                out.append(_rate(command, env, timeout=600))
            if console is not None:
                console.print(
                    f"  run {i + 1}/{repeats}: as is {as_is[-1]:.1f} samples/s, "
                    f"recommended {applied[-1]:.1f} samples/s ({applied[-1] / as_is[-1]:.2f}x)"
                )
    base, best = statistics.median(as_is), statistics.median(applied)
    # each pair ran back to back: their ratio is less disturbed by the machine's load swings
    pairs = [b / a for a, b in zip(as_is, applied, strict=True)]
    kwargs = recommended.get("kwargs", {})
    return BenchResult(
        name="torchvision",
        ratio=statistics.median(pairs),
        baseline={"command": "python examples/torchvision_imagefolder.py", "samples_per_s": base},
        unstall={
            "command": "unstall run --config recommendation.json -- python ...",
            "kwargs": kwargs,
            "samples_per_s": best,
        },
        rows=[
            {
                "case": "as is (torchvision transforms, 2 workers)",
                "samples_per_s": round(base, 1),
                "runs": [round(v, 1) for v in as_is],
            },
            {
                "case": f"under unstall run, config {json.dumps(kwargs)}",
                "samples_per_s": round(best, 1),
                "runs": [round(v, 1) for v in applied],
                "ratio": round(statistics.median(pairs), 3),
            },
        ],
        detail={
            "goal": GOAL,
            "repeats": repeats,
            "images": images,
            "step_ms": STEP_MS,
            "ratio_of_medians": round(best / base, 4),
            "pair_ratios": [round(r, 3) for r in pairs],
        },
        notes=[
            f"{repeats} alternating pairs of runs, one epoch of {images} images each, batch 32, "
            f"2 workers, a simulated step of {STEP_MS} ms; the config is what `unstall analyze "
            "--quick` recommended for the unchanged script in the same run; ratio: the median of "
            "the pairs' ratios (goal >= 2x)",
            "pairs' ratios, in run order: " + ", ".join(f"{r:.2f}" for r in pairs),
        ],
    )
