"""`unstall make-dataset`: writes the dataset, prints a summary, exits 2 naming a bad parameter."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from unstall.cli import main
from unstall.data.synthetic import render_image


def test_make_dataset_writes_and_summarizes(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["make-dataset", str(tmp_path), "--images", "12", "--classes", "3", "--seed", "1"]
    assert main([*argv, "--workers", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"12 images in 3 classes at {tmp_path}: 12 written, 0 already there" in out
    assert " KB, " in out and " MB in " in out
    files = sorted(tmp_path.rglob("*.jpg"))
    assert len(files) == 12
    assert sorted({p.parent.name for p in files}) == ["class_000", "class_001", "class_002"]
    expected = render_image(1, 4, classes=3, quality=90)
    assert (tmp_path / "class_001" / "img_000004.jpg").read_bytes() == expected

    assert main([*argv, "--no-progress"]) == 0
    assert "0 written, 12 already there" in capsys.readouterr().out


def test_quality_option_changes_bytes(tmp_path: Path) -> None:
    argv = ["make-dataset", str(tmp_path), "--images", "2", "--classes", "1", "--no-progress"]
    assert main([*argv, "--quality", "70"]) == 0
    data = (tmp_path / "class_000" / "img_000000.jpg").read_bytes()
    assert (
        hashlib.sha256(data).digest()
        == hashlib.sha256(render_image(0, 0, classes=1, quality=70)).digest()
    )


def test_mismatch_exits_2_naming_parameter(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    base = ["make-dataset", str(tmp_path), "--images", "2", "--classes", "1", "--no-progress"]
    assert main(base) == 0
    assert main([*base[:-1], "--seed", "5", "--no-progress"]) == 2
    assert "made with seed=0, not seed=5" in capsys.readouterr().err
    assert main(["make-dataset", str(tmp_path / "x"), "--images", "0", "--classes", "1"]) == 2
    assert "images=0 must be at least 1" in capsys.readouterr().err


def test_images_and_classes_are_required(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["make-dataset", "somewhere"])
    assert exc.value.code == 2
    assert "--images" in capsys.readouterr().err


def test_audio_clips_are_written_and_summarized(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    soundfile = pytest.importorskip("soundfile")
    argv = ["make-dataset", str(tmp_path), "--audio", "5", "--seconds", "0.5", "--format", "flac"]
    assert main([*argv, "--classes", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"5 FLAC clips in 2 classes at {tmp_path}: 5 written, 0 already there" in out
    files = sorted(tmp_path.rglob("*.flac"))
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "class_000/clip_000000.flac",
        "class_000/clip_000002.flac",
        "class_000/clip_000004.flac",
        "class_001/clip_000001.flac",
        "class_001/clip_000003.flac",
    ]
    for f in files:
        info = soundfile.info(str(f))
        assert (info.samplerate, info.channels, info.frames) == (44_100, 2, 22_050)
    assert main([*argv, "--classes", "2", "--no-progress"]) == 0
    assert "0 written, 5 already there" in capsys.readouterr().out


def test_audio_defaults_to_ten_classes_and_mono_on_request(tmp_path: Path) -> None:
    soundfile = pytest.importorskip("soundfile")
    argv = ["make-dataset", str(tmp_path), "--audio", "10", "--seconds", "0.2"]
    assert main([*argv, "--format", "wav", "--channels", "1", "--rate", "8000"]) == 0
    folders = sorted(p.name for p in tmp_path.iterdir() if p.is_dir())
    assert folders == [f"class_{i:03d}" for i in range(10)]
    info = soundfile.info(str(tmp_path / "class_003" / "clip_000003.wav"))
    assert (info.samplerate, info.channels, info.frames) == (8_000, 1, 1_600)


def test_images_without_classes_or_with_audio_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["make-dataset", str(tmp_path), "--images", "2"]) == 2
    assert "--images needs --classes" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["make-dataset", str(tmp_path), "--images", "2", "--audio", "2"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err
    assert main(["make-dataset", str(tmp_path), "--audio", "2", "--rate", "44000"]) == 2
    assert "rate=44000 is not an MP3 sample rate" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
