"""The M5 audio script (examples/audio_m5.py: soundfile reads in C, mono, soxr to 8 kHz, a
fixed length), unchanged under ``unstall run --config`` with the sample cache: every clip
once per epoch, and epoch 2's samples (served from the cache) bit-identical to epoch 1's
and to the script's own, run as it is."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.scripts import load_script
from unstall.cache import clear_caches, list_caches
from unstall.data.audio import make_audio_dataset

pytest.importorskip("soundfile")
pytest.importorskip("soxr")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "audio_m5.py"
CLIPS, SAMPLES = 10, 8_000


def _script(data: Path, ids: Path, epochs: int) -> list[str]:
    command = [sys.executable, str(SCRIPT), str(data), "--epochs", str(epochs)]
    command += ["--batch-size", "4", "--workers", "2", "--samples", str(SAMPLES)]
    return [*command, "--model-rate", "100000", "--ids", str(ids)]


def _start(command: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
        start_new_session=True,  # its workers too are stopped on a failure (`os.killpg`)
    )


def _finish(process: subprocess.Popen) -> tuple[str, str]:
    return process.communicate(timeout=300)


def _records(ids: Path) -> list[dict]:
    return [json.loads(line) for line in ids.read_text().splitlines()]


def _expected(data: Path) -> Counter:
    """(sha256 of the waveform's bytes, label) of each clip, from the script's own Dataset."""
    module = load_script(SCRIPT, "audio_m5_under_test")
    dataset = module.ClipFolder(str(data), samples=SAMPLES)
    out = Counter()
    for i in range(len(dataset)):
        wave, label = dataset[i]
        assert wave.dtype.is_floating_point and tuple(wave.shape) == (1, SAMPLES)
        out[(hashlib.sha256(wave.numpy().tobytes()).hexdigest(), label)] += 1
    return out


def test_sample_cache_serves_every_clip_once_per_epoch_bit_identical(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSTALL_SHM_NAMESPACE", f"audiom5{os.getpid()}")
    monkeypatch.setenv("UNSTALL_CACHE_KEEP_S", "120")  # the segment outlives the job: listed
    data = tmp_path / "data"
    make_audio_dataset(data, clips=CLIPS, classes=2, seconds=1.0, progress=False)

    plain, cached = tmp_path / "plain.jsonl", tmp_path / "cached.jsonl"
    config = tmp_path / "samples.json"
    config.write_text(json.dumps({"kwargs": {"cache": {"size": "64MiB", "hold": "samples"}}}))
    command = [sys.executable, "-m", "unstall", "run", "--config", str(config), "--"]
    # the script as it is and under the config, side by side (each reads the clips alone)
    runs = [_start(_script(data, plain, 1), tmp_path)]
    runs.append(_start(command + _script(data, cached, 2), tmp_path))
    try:
        expected = _expected(data)  # meanwhile, in this process
        assert len(expected) == CLIPS  # ten different waveforms: a hash names a clip
        (_, plain_err), (_, err) = (_finish(p) for p in runs)
        assert runs[0].returncode == 0, plain_err
        assert runs[1].returncode == 0, err
        assert "caching ClipFolder's 10 prepared samples (deterministic: checked" in err
        segments = [s for s in list_caches() if s["tier"] == "ram"]
        assert [(s["items"], s["items_cached"]) for s in segments] == [(CLIPS, CLIPS)]
    finally:
        for p in runs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for s in list_caches():
            clear_caches(s["name"], force=True)

    def epoch(records: list[dict], n: int) -> Counter:
        rows = [r for r in records if r["epoch"] == n]
        assert all(r["dtype"] == "torch.float32" and r["shape"] == [1, SAMPLES] for r in rows)
        return Counter((r["sha256"], r["label"]) for r in rows)

    assert epoch(_records(plain), 0) == expected  # the script as it is: each clip once
    records = _records(cached)
    assert epoch(records, 0) == expected  # epoch 1 prepared and stored
    assert epoch(records, 1) == expected  # epoch 2 from the cache: the same bits, once each
    assert len(records) == 2 * CLIPS
