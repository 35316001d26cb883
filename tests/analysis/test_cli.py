"""`unstall analyze --data DIR --model resnet50 --rate N --quick`: end to end, on real JPEGs."""

from __future__ import annotations

import json
import os

from tests.conftest import write_jpegs
from unstall.cli import main


def test_builtin_workload_end_to_end(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    data = write_jpegs(tmp_path / "images", 192, classes=4, seed=0)
    out, config = tmp_path / "report.json", tmp_path / "rec.json"
    code = main(
        [
            "analyze",
            "--data",
            str(data),
            "--model",
            "resnet50",
            "--rate",
            "4000",
            "--quick",
            "--batch-size",
            "8",
            "--steps",
            "8",
            "--json",
            str(out),
            "--html",
            str(tmp_path / "html"),
            "--config-out",
            str(config),
            "--what-if",
            "workers=1",
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["runs"]["cold"]["steps"] == 8 and report["runs"]["cold"]["samples"] == 64
    # decoding 500x375 JPEGs on 2 cores cannot feed a 4,000/s model: prep-bound
    assert report["bottleneck"] == "prep", report["stall"]
    assert report["ingestion_rate"] > 3000
    # the lean remedy priced on the folder's own files (unstall's ImageFolder lists them)
    lean = next(r for r in report["remedies"] if r["remedy"] == "lean")
    assert "not_measured" not in lean and lean["probe"]["samples"] >= 4, lean
    assert json.loads(config.read_text())["kwargs"] == report["recommendation"]["kwargs"]
    printed = capsys.readouterr().out
    assert "Prep-bound" in printed and "What if workers=1" in printed
    assert (tmp_path / "html" / "index.html").exists()
    assert (tmp_path / "html" / "trace.json").exists()


def test_needs_data_or_a_command(capsys):
    assert main(["analyze"]) == 2
    assert "--data" in capsys.readouterr().out


def test_bad_what_if_names_the_key(tmp_path, capsys):
    (tmp_path / "images").mkdir()
    data = write_jpegs(tmp_path / "images", 48, classes=2, seed=0)
    code = main(
        [
            "analyze",
            "--data",
            str(data),
            "--rate",
            "4000",
            "--batch-size",
            "8",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--what-if",
            "speed=2",
            "--html",
            str(tmp_path / "h"),
        ]
    )
    assert code == 2
    assert "speed" in capsys.readouterr().out
    # the run's cache segment is gone (its name has this process's id: others run beside)
    assert not [n for n in os.listdir("/dev/shm") if f"analyze-{os.getpid()}-" in n]
