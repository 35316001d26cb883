"""The M5 audio script (examples/audio_m5.py: soundfile reads in C, mono, soxr to 8 kHz, a
fixed length), unchanged under ``unstall run --config`` with the sample cache: every clip
once per epoch, and epoch 2's samples (served from the cache) bit-identical to epoch 1's
and to the script's own, run as it is."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

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


def _records(ids: Path) -> list[dict]:
    return [json.loads(line) for line in ids.read_text().splitlines()]


def _expected(data: Path) -> Counter:
    """(sha256 of the waveform's bytes, label) of each clip, from the script's own Dataset."""
    spec = importlib.util.spec_from_file_location("audio_m5_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
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
    expected = _expected(data)
    assert len(expected) == CLIPS  # ten different waveforms: a hash names a clip

    plain = tmp_path / "plain.jsonl"
    done = subprocess.run(
        _script(data, plain, 1), capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    config = tmp_path / "samples.json"
    config.write_text(json.dumps({"kwargs": {"cache": {"size": "64MiB", "hold": "samples"}}}))
    cached = tmp_path / "cached.jsonl"
    command = [sys.executable, "-m", "unstall", "run", "--config", str(config), "--"]
    try:
        done = subprocess.run(
            command + _script(data, cached, 2),
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr
        assert "caching ClipFolder's 10 prepared samples (deterministic: checked" in done.stderr
        segments = [s for s in list_caches() if s["tier"] == "ram"]
        assert [(s["items"], s["items_cached"]) for s in segments] == [(CLIPS, CLIPS)]
    finally:
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
