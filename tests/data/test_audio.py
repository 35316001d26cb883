"""make_audio_dataset: clips read back with soundfile (count, rate, channels, length), the same
bytes for any worker count, WAV/FLAC/MP3, drawn lengths, resume, parameters checked."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from unstall.data.audio import (
    clip_key,
    clip_seconds,
    encode_clip,
    ensure_audio_dataset,
    make_audio_dataset,
    render_clip,
)
from unstall.data.synthetic import MANIFEST

soundfile = pytest.importorskip("soundfile")

CLIPS, CLASSES = 6, 3


def _hashes(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("clip_*"))
    }


@pytest.fixture(scope="module")
def mp3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("audio") / "mp3"
    info = make_audio_dataset(
        root, clips=CLIPS, classes=CLASSES, seconds=1.0, workers=2, progress=False
    )
    assert (info.clips, info.written, info.skipped) == (CLIPS, CLIPS, 0)
    return root


def test_mp3_clips_read_back_as_44k_stereo_of_the_length_asked(mp3: Path) -> None:
    files = sorted(mp3.rglob("*.mp3"))
    assert [f.relative_to(mp3).as_posix() for f in files] == sorted(
        clip_key(i, clips=CLIPS, classes=CLASSES, format="mp3") for i in range(CLIPS)
    )
    assert (mp3 / "class_001" / "clip_000004.mp3").exists()  # class = index % classes
    for f in files:
        info = soundfile.info(str(f))
        assert (info.format, info.samplerate, info.channels) == ("MP3", 44_100, 2)
        data, rate = soundfile.read(str(f), dtype="float32")
        assert data.shape == (44_100, 2) and rate == 44_100
        assert 0.05 < float(np.abs(data).max()) <= 1.0  # not silence
        assert not np.allclose(data[:, 0], data[:, 1])  # two channels of their own
    sizes = [f.stat().st_size for f in files]
    assert all(19_000 < s < 22_000 for s in sizes)  # 160 kbit/s: 20 KB a second


def test_same_bytes_for_any_worker_count_and_a_new_seed_changes_them(
    mp3: Path, tmp_path: Path
) -> None:
    make_audio_dataset(
        tmp_path / "a", clips=CLIPS, classes=CLASSES, seconds=1.0, workers=1, progress=False
    )
    assert _hashes(tmp_path / "a") == _hashes(mp3)
    make_audio_dataset(
        tmp_path / "b", clips=CLIPS, classes=CLASSES, seconds=1.0, seed=1, progress=False
    )
    assert set(_hashes(tmp_path / "b").values()).isdisjoint(_hashes(mp3).values())


@pytest.mark.parametrize("format", ["wav", "flac"])
def test_lossless_clips_hold_the_rendered_samples(tmp_path: Path, format: str) -> None:
    info = make_audio_dataset(
        tmp_path,
        clips=4,
        classes=2,
        seconds=0.5,
        format=format,
        rate=16_000,
        channels=1,
        progress=False,
    )
    assert (info.written, info.total_bytes > 0) == (4, True)
    files = sorted(tmp_path.rglob(f"*.{format}"))
    assert len(files) == 4
    for i in range(4):
        path = tmp_path / clip_key(i, clips=4, classes=2, format=format)
        data, rate = soundfile.read(str(path), dtype="float32", always_2d=True)
        assert (rate, data.shape) == (16_000, (8_000, 1))
        expected = render_clip(0, i, classes=2, seconds=0.5, rate=16_000, channels=1)
        assert np.abs(data - expected).max() < 1 / 2**14  # 16-bit PCM of the rendered clip


def test_lengths_drawn_between_seconds_and_max_seconds(tmp_path: Path) -> None:
    make_audio_dataset(
        tmp_path, clips=5, classes=1, seconds=0.5, max_seconds=2.0, format="wav", progress=False
    )
    lengths = []
    for i in range(5):
        info = soundfile.info(str(tmp_path / clip_key(i, clips=5, classes=1, format="wav")))
        lengths.append(info.frames)
        assert info.frames == round(clip_seconds(0, i, 0.5, 2.0) * 44_100)
    assert all(0.5 * 44_100 <= n <= 2.0 * 44_100 for n in lengths)
    assert len(set(lengths)) > 1


def test_rerun_skips_and_other_parameters_are_refused_by_name(mp3: Path) -> None:
    info = make_audio_dataset(mp3, clips=CLIPS, classes=CLASSES, seconds=1.0, progress=False)
    assert (info.written, info.skipped) == (0, CLIPS)
    assert info.mean_bytes == pytest.approx(
        sum(f.stat().st_size for f in mp3.rglob("*.mp3")) / CLIPS
    )
    manifest = json.loads((mp3 / MANIFEST).read_text())
    assert (manifest["kind"], manifest["format"], manifest["seconds"]) == ("audio", "mp3", 1.0)
    with pytest.raises(ValueError, match=re.escape("made with seconds=1.0, not seconds=2.0")):
        make_audio_dataset(mp3, clips=CLIPS, classes=CLASSES, seconds=2.0, progress=False)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"clips": 0}, "clips=0 must be at least 1"),
        ({"classes": 9}, "classes=9 must be between 1 and clips"),
        ({"format": "ogg"}, "format='ogg' must be one of wav, flac, mp3"),
        ({"channels": 3}, "channels=3 must be 1 or 2"),
        ({"rate": 44_000}, "rate=44000 is not an MP3 sample rate"),
        ({"seconds": 0.0}, "seconds=0.0 must be between 0.1 and 600"),
        ({"max_seconds": 0.5}, "max_seconds=0.5 must be between seconds and 600"),
    ],
)
def test_bad_parameters_raise_naming_them(tmp_path: Path, kwargs: dict, message: str) -> None:
    args = {"clips": 4, "classes": 2, "seconds": 1.0, **kwargs}
    with pytest.raises(ValueError, match=re.escape(message)):
        make_audio_dataset(tmp_path / "x", progress=False, **args)
    assert not (tmp_path / "x").exists()  # nothing written


def test_ensure_audio_dataset_keeps_it_in_the_cache_dir(tmp_path: Path) -> None:
    path = ensure_audio_dataset(3, seconds=0.5, format="wav", classes=3, cache_dir=tmp_path)
    assert path == tmp_path / "datasets" / "audio-3x0.5s-3c-wav-seed0"
    assert len(list(path.rglob("*.wav"))) == 3
    first = _hashes(path)
    assert ensure_audio_dataset(3, seconds=0.5, format="wav", classes=3, cache_dir=tmp_path)
    assert _hashes(path) == first


def test_encode_clip_is_deterministic() -> None:
    samples = render_clip(3, 7, classes=4, seconds=0.3)
    assert samples.dtype == np.float32 and samples.shape == (13_230, 2)
    assert np.array_equal(samples, render_clip(3, 7, classes=4, seconds=0.3))
    assert encode_clip(samples, rate=44_100, format="mp3") == encode_clip(
        samples, rate=44_100, format="mp3"
    )
