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
