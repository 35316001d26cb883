"""`unstall analyze -- python examples/train_min.py`: the unedited script, run and stopped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from unstall.loader.config import load_overrides

ROOT = Path(__file__).resolve().parents[2]


def test_script_mode_runs_stops_and_leaves_nothing(tmp_path):
    out = tmp_path / "report.json"
    rec = tmp_path / "rec.json"
    before = set(os.listdir("/dev/shm"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "unstall",
            "analyze",
            "--steps",
            "8",
            "--warmup",
            "2",
            "--json",
            str(out),
            "--html",
            str(tmp_path / "html"),
            "--config-out",
            str(rec),
            "--",
            sys.executable,
            str(ROOT / "examples" / "train_min.py"),
            "--samples",
            "1024",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    for mode in ("synthetic", "cold", "cached"):
        assert report["runs"][mode]["steps"] == 8, report["runs"]
        assert report["runs"][mode]["samples"] == 8 * 64  # the script's batch size
    assert report["num_workers"] == 2 and report["batch_size"] == 64
    assert report["bottleneck"] in ("compute", "prep", "fetch")
    assert "CPU time" in report["split"]
    # the recommendation file is what `unstall run --config FILE` applies
    kwargs = load_overrides(str(rec))
    assert kwargs["num_workers"] == report["recommendation"]["kwargs"]["num_workers"]
    trace = json.loads((tmp_path / "html" / "trace.json").read_text())
    assert any(e.get("name") == "prepare" for e in trace["traceEvents"])
    # every run was stopped cleanly: no process and no shared memory left behind
    assert not [
        p for p in psutil.Process().children(recursive=True) if "train_min" in " ".join(p.cmdline())
    ]
    assert not {n for n in set(os.listdir("/dev/shm")) - before if "unstall" in n}


def test_every_rank_reported_and_the_slowest_named():
    from unstall.analysis.script import _rank_table

    def doc(rank: int, step_s: float, wait_s: float) -> dict:
        return {"rank": rank, "steps": [[wait_s, step_s - wait_s, 32]] * 10}

    rows = _rank_table([doc(0, 0.1, 0.02), doc(1, 0.2, 0.15), doc(2, 0.1, 0.01)])
    assert [r["rank"] for r in rows] == [1, 0, 2]  # slowest first
    assert rows[0] == {"rank": 1, "samples_per_s": 160.0, "wait_share": 0.75}
