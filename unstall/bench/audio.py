"""`bench audio`: the paper's audio job (M5 on MP3 clips), an unchanged script: as it is,
under ``unstall run`` with the byte cache, and with the sample cache.

The script is ``examples/audio_m5.py``: a Dataset whose ``__getitem__`` reads a clip with
soundfile (libsndfile opens and decodes the file in C), mixes it to mono, resamples it to
8 kHz with soxr and keeps 80,000 samples (10 s, zero-padded); 2 workers, batch 32, a
simulated model at `MODEL_RATE` samples/s (far above what 2 workers prepare: the job is
prep-bound). The clips are 44.1 kHz stereo 160 kbit/s MP3s (`ensure_audio_dataset`: made
once, kept in the cache directory), read once before any timed run (page cache warm).

Each round runs the script three ways, in an order that rotates from round to round:
as it is; under ``unstall run --config`` with ``{"kwargs": {"cache": SIZE}}`` (the byte
cache: it serves files a dataset opens through Python's ``open``; soundfile's reads in C
never reach it, which the bench shows: the segment's items after the run); and with
``{"kwargs": {"cache": {"size": SIZE, "hold": "samples"}}}`` (the sample cache: the
prepared waveform per clip, after a determinism check). Rates are from epoch 2 on (epoch
1 fills a cache); ratios are taken within a round, then the median over rounds. The runs
use a shared-memory namespace of their own; its segments are kept between runs (as a
node's cache is between jobs) and removed at the end.
"""

from __future__ import annotations

import json
import os
import re
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
    "the M5 audio job (MP3 -> mono -> 8 kHz -> 80,000 samples), unchanged: as is, byte "
    "cache, sample cache, from epoch 2 (goals: sample cache >= 10x as is, >= 8x byte cache)"
)
SCRIPT = harness.EXAMPLES / "audio_m5.py"
#: the simulated model: far above the ~30-60 clips/s 2 workers prepare
MODEL_RATE = 8000.0
#: Epochs per run: epoch 1 fills a cache, the rate is from epoch 2 on; the sample cache's
#: fast epochs are short, so it runs one more.
EPOCHS = {"as_is": 2, "bytes": 2, "samples": 3}
CACHE_SIZE = "2GiB"
GOALS = {"samples_vs_as_is": 10.0, "samples_vs_bytes": 8.0}
#: (clips, seconds per clip, rounds)
SIZES = {"quick": (200, 10.0, 1), "full": (1000, 10.0, 2)}
#: case -> (row label, config kwargs or None for the script as is)
CASES: dict[str, tuple[str, dict[str, Any] | None]] = {
    "as_is": ("as is (soundfile + soxr in 2 workers)", None),
    "bytes": ("byte cache", {"cache": CACHE_SIZE}),
    "samples": ("sample cache", {"cache": {"size": CACHE_SIZE, "hold": "samples"}}),
}
_EPOCH = re.compile(r"epoch (\d+): (\d+) samples in ([0-9.]+) s")


def parse_epochs(stdout: str) -> list[dict[str, float]]:
    """The script's per-epoch lines: ``{"epoch", "samples", "seconds", "samples_per_s"}``."""
    out = []
    for epoch, samples, seconds in _EPOCH.findall(stdout):
        s, n = float(seconds), int(samples)
        out.append({"epoch": int(epoch), "samples": n, "seconds": s, "samples_per_s": n / s})
    return out


def from_epoch_2(epochs: list[dict[str, float]]) -> float:
    """Samples/s over epochs 2 and later (all their samples over all their seconds)."""
    later = [e for e in epochs if e["epoch"] >= 2]
    if not later:
        raise ValueError("the run has no epoch 2")
    return sum(e["samples"] for e in later) / sum(e["seconds"] for e in later)


def summarize(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """Per round, each case's rate from epoch 2 and the ratios between cases in that round;
    then each case's median rate and each ratio's median over the rounds."""
    pairs = {
        "samples_vs_as_is": ("samples", "as_is"),
        "samples_vs_bytes": ("samples", "bytes"),
        "bytes_vs_as_is": ("bytes", "as_is"),
    }
    ratios: dict[str, list[float]] = {}
    for name, (a, b) in pairs.items():
        if all(a in r and b in r for r in rounds):
            ratios[name] = harness.Pairs([r[b] for r in rounds], [r[a] for r in rounds]).ratios
    cases = [c for c in CASES if all(c in r for r in rounds)]
    return {
        "rates": {c: statistics.median(r[c] for r in rounds) for c in cases},
        "ratios": {k: statistics.median(v) for k, v in ratios.items()},
        "round_ratios": ratios,
    }


def run(
    *,
    quick: bool,
    console: Any = None,
    repeats: int | None = None,
    clips: int | None = None,
    seconds: float | None = None,
    cases: tuple[str, ...] = tuple(CASES),
) -> BenchResult:
    """``repeats``: rounds (default 1 quick, 2 full); ``clips`` and ``seconds`` override the
    dataset's size (the tests make a small one)."""
    import soundfile  # noqa: F401  (the script needs them; say so before anything runs)
    import soxr  # noqa: F401

    from unstall.data.audio import ensure_audio_dataset

    harness.check_example(SCRIPT, "audio")
    size = SIZES["quick" if quick else "full"]
    clips, seconds = clips or size[0], seconds or size[1]
    rounds = repeats or size[2]
    say = console.print if console is not None else (lambda *_: None)
    say(f"  the clips: {clips} x {seconds:g} s MP3 (made once, kept in the cache directory)")
    data = os.fspath(
        ensure_audio_dataset(
            clips, seconds=seconds, classes=min(10, clips), progress=console is not None
        )
    )
    cpu = prep_cpu_ms(data)
    say(f"  CPU per clip as is (one thread, read + mono + 8 kHz + pad): {cpu:.1f} ms")
    env = harness.script_env(
        UNSTALL_SHM_NAMESPACE=f"benchaudio{os.getpid()}",
        UNSTALL_CACHE_KEEP_S="3600",  # each segment outlives its run: listed, then cleared
    )
    py = sys.executable
    script = [py, SCRIPT.as_posix(), data, "--workers", "2", "--batch-size", "32"]
    script += ["--model-rate", str(MODEL_RATE)]
    table: list[dict[str, float]] = []

    def said(i: int, order: list[str], last: dict[str, dict[str, Any]]) -> None:
        table.append({c: last[c]["from_epoch_2"] for c in cases})
        say(
            f"  round {i + 1}/{rounds} (order {', '.join(order)}): "
            + ", ".join(f"{c} {table[-1][c]:.1f}" for c in cases)
            + " samples/s from epoch 2"
        )

    read_all(data)  # the page cache warm before any timed run
    try:
        with tempfile.TemporaryDirectory(prefix="unstall-bench-audio-") as tmp:
            sides = {c: (lambda c=c: _run_case(c, script, env, tmp)) for c in cases}
            runs = harness.rotate(sides, rounds, said)
    finally:
        _clear_segments(env)
    s = summarize(table)
    return _result(s, runs, cases, clips=clips, seconds=seconds, rounds=rounds, cpu_ms=cpu)


def prep_cpu_ms(root: str, clips: int = 6) -> float:
    """CPU ms per clip of the script's ``dataset[i]``, in this process, one thread."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import audio_m5
    finally:
        sys.path.remove(str(SCRIPT.parent))
    dataset = audio_m5.ClipFolder(root)
    dataset[0]  # warm
    n = min(clips, len(dataset))
    c0 = time.thread_time()
    for i in range(n):
        dataset[i]
    return (time.thread_time() - c0) / n * 1e3


def _run_case(case: str, script: list[str], env: dict[str, str], tmp: str) -> dict[str, Any]:
    """One run of the script (as is, or under ``unstall run --config``): its epochs, its
    rate from epoch 2, the cores others used meanwhile, and the bench's cache segments."""
    kwargs = CASES[case][1]
    command = [*script, "--epochs", str(EPOCHS[case])]
    if kwargs is not None:
        config = os.path.join(tmp, f"{case}.json")
        with open(config, "w") as f:
            json.dump({"kwargs": kwargs}, f)
        command = harness.under_unstall(config, command)
    done = harness.run_script(command, env, timeout=1800)
    epochs = parse_epochs(done.stdout)
    if len(epochs) != EPOCHS[case]:
        raise RuntimeError(f"{case}: {len(epochs)} epoch lines, not {EPOCHS[case]}: {done.stdout}")
    return {
        "epochs": epochs,
        "from_epoch_2": from_epoch_2(epochs),
        "others_cores": done.others_cores,
        "segments": _segments(env, samples=case == "samples") if kwargs is not None else [],
    }


def _segments(env: dict[str, str], *, samples: bool) -> list[dict[str, Any]]:
    """The sample cache's segments (``samples``) or the byte cache's in the bench's
    namespace (the sample cache's names carry ``-samples-``): what each holds."""
    code = "import json; from unstall.cache import list_caches; print(json.dumps(list_caches()))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        return []
    keep = ("name", "items", "items_cached", "used_bytes")
    found = [s for s in json.loads(done.stdout) if s["tier"] == "ram"]
    return [{k: s.get(k) for k in keep} for s in found if ("-samples-" in s["name"]) == samples]


def _clear_segments(env: dict[str, str]) -> None:
    """Remove the segments of the bench's namespace (only those: other jobs' stay)."""
    code = (
        "from unstall.cache import clear_caches, list_caches\n"
        "for s in list_caches():\n"
        "    if s['tier'] == 'ram': clear_caches(s['name'], force=True)\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=120)


def _result(
    s: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
    cases: tuple[str, ...],
    *,
    clips: int,
    seconds: float,
    rounds: int,
    cpu_ms: float,
) -> BenchResult:
    rates, ratios = s["rates"], s["ratios"]
    rows = []
    for case in cases:
        label, kwargs = CASES[case]
        first = [r["epochs"][0]["samples_per_s"] for r in runs[case]]
        segments = runs[case][-1]["segments"]
        rows.append(
            {
                "case": label,
                "config": "-" if kwargs is None else json.dumps({"kwargs": kwargs}),
                "samples_per_s": round(rates[case], 1),
                "epoch_1": round(statistics.median(first), 1),
                "runs": [round(r["from_epoch_2"], 1) for r in runs[case]],
                "vs_as_is": round(rates[case] / rates["as_is"], 2) if "as_is" in rates else None,
                "cached": ", ".join(f"{g['items_cached']}/{g['items']}" for g in segments)
                if segments
                else "-",
            }
        )
    headline = ratios.get("samples_vs_as_is", ratios.get("bytes_vs_as_is", 0.0))
    others = [r["others_cores"] for case in cases for r in runs[case]]
    notes = [
        f"{rounds} rounds; each runs the script once per case, the cases' order rotating "
        f"(epochs: {', '.join(f'{c} {EPOCHS[c]}' for c in cases)}); {clips} clips of "
        f"{seconds:g} s (44.1 kHz stereo MP3, 160 kbit/s), batch 32, 2 workers, a simulated "
        f"model at {MODEL_RATE:g} samples/s",
        "rates from epoch 2 on; ratios within each round, then the median over rounds: "
        + "; ".join(
            f"{k} {ratios[k]:.2f}x (rounds: {', '.join(f'{v:.2f}' for v in s['round_ratios'][k])})"
            for k in ratios
        ),
        f"CPU per clip as is, one thread: {cpu_ms:.1f} ms (read + decode in libsndfile, mono, "
        "soxr to 8 kHz, pad)",
        "`cached`: items held / items listed by each cache segment after the last run: the "
        "byte cache lists the clips but never sees soundfile's reads (libsndfile opens them "
        "in C, not through Python's open)",
        f"cores other processes kept busy during the runs: median "
        f"{statistics.median(others):.2f}, most {max(others):.2f} (of {machine.cpus_installed()})",
    ]
    return BenchResult(
        name="audio",
        ratio=headline,
        baseline={"command": "python examples/audio_m5.py", "samples_per_s": rates.get("as_is")},
        unstall={
            "command": "unstall run --config samples.json -- python examples/audio_m5.py",
            "kwargs": CASES["samples"][1],
            "samples_per_s": rates.get("samples"),
        },
        rows=rows,
        detail={
            "goals": GOALS,
            "ratios": {k: round(v, 3) for k, v in ratios.items()},
            "round_ratios": {k: [round(x, 3) for x in v] for k, v in s["round_ratios"].items()},
            "clips": clips,
            "seconds": seconds,
            "rounds": rounds,
            "epochs": {c: EPOCHS[c] for c in cases},
            "model_rate": MODEL_RATE,
            "cpu_ms_per_clip": round(cpu_ms, 2),
            "runs": {c: runs[c] for c in cases},
        },
        notes=notes,
    )
