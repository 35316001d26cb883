"""`unstall analyze -- python examples/train_min.py`: the unedited script, run and stopped."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.analysis.conftest import analyze_here
from unstall.loader.config_file import load_overrides

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_script_mode_runs_stops_and_leaves_nothing(tmp_path, own_shm_dir):
    out = tmp_path / "report.json"
    rec = tmp_path / "rec.json"
    code, printed = analyze_here(
        tmp_path,
        [
            "analyze",
            "--steps",
            "8",
            "--warmup",
            "2",
            "--min-seconds",
            "1",
            "--no-verify",
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
            "8192",  # batches for the cold window and then the model alone's, in one run
        ],
    )
    assert code == 0, printed
    report = json.loads(out.read_text())
    for mode in ("synthetic", "cold", "cached"):
        run = report["runs"][mode]
        assert run["steps"] >= 8, report["runs"]  # steps and seconds: at least, not exactly
        assert run["samples"] == 64 * run["steps"]  # the script's batch size, from the batches
    assert report["num_workers"] == 2 and report["batch_size"] == 64
    # the model alone was timed in the cold run's processes, after its window: two runs in all
    assert any("timed in the cold run's own processes" in n for n in report["notes"])
    assert report["bottleneck"] in ("compute", "prep", "fetch")
    assert "CPU" in report["split"]
    # the burst (2 workers x prefetch 2) and the warm-up were skipped, not timed
    assert "4 batches" in report["notes"][0]
    # the recommendation file is what `unstall run --config FILE` applies
    kwargs = load_overrides(str(rec))
    assert kwargs["num_workers"] == report["recommendation"]["kwargs"]["num_workers"]
    trace = json.loads((tmp_path / "html" / "trace.json").read_text())
    assert any(e.get("name") == "prepare" for e in trace["traceEvents"])
    # every run was stopped cleanly: no process and no shared memory left behind
    assert not [
        p for p in psutil.Process().children(recursive=True) if "train_min" in " ".join(p.cmdline())
    ]
    assert os.listdir(own_shm_dir) == []  # the runs' shared memory (this test's own folder)


def test_a_failing_script_shows_its_last_lines(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text("print('loading the data...')\nraise SystemExit('no such folder: /data')\n")
    code, printed = analyze_here(
        tmp_path, ["analyze", "--quick", "--", sys.executable, str(script)]
    )
    assert code == 2
    assert "no such folder: /data" in printed and "loading the data" in printed


def test_every_rank_reported_and_the_slowest_named():
    from unstall.analysis.measure.script.runner import rank_table

    def doc(rank: int, step_s: float, wait_s: float) -> dict:
        return {"rank": rank, "steps": [[wait_s, step_s - wait_s, 32]] * 10}

    rows = rank_table([doc(0, 0.1, 0.02), doc(1, 0.2, 0.15), doc(2, 0.1, 0.01)])
    assert [r["rank"] for r in rows] == [1, 0, 2]  # slowest first
    assert rows[0] == {"rank": 1, "samples_per_s": 160.0, "wait_share": 0.75}


HUNG = """
import os, signal, subprocess, sys, time
import psutil
from torch.utils.data import DataLoader

# a helper process the script started (SIGINT ends it; one that ignores it: the test below)
helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
loader = DataLoader(list(range(64)), batch_size=4, num_workers=2, persistent_workers=True)
it = iter(loader)
for _ in range(3):
    next(it)
with open(sys.argv[1], "w") as f:
    f.write(" ".join(str(c.pid) for c in psutil.Process().children(recursive=True)))
    f.write(f" {os.getpid()}")  # the script itself, last
print("three batches in; now waiting on the other rank", flush=True)

def stuck_in_a_collective():
    while True:
        time.sleep(1)

stuck_in_a_collective()
"""


@pytest.mark.timeout(120)
def test_a_hung_run_is_stopped_whole_and_says_where_it_was(tmp_path, own_shm_dir):
    """Past --run-timeout the run's whole process group stops (its workers and a helper it
    started too), /dev/shm is as it was, and the error shows where each process was."""
    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    pids_file = tmp_path / "pids"
    before = set(os.listdir("/dev/shm"))
    command = ["analyze", "--quick", "--run-timeout", "12"]
    code, printed = analyze_here(
        tmp_path, [*command, "--", sys.executable, str(script), str(pids_file)]
    )
    out = " ".join(printed.split())  # rich folds long lines
    assert code == 2, printed
    assert "the cold run of" in out and "did not end within 12 s and was stopped" in out
    assert "in stuck_in_a_collective" in out and "now waiting on the other rank" in out
    pids = [int(p) for p in pids_file.read_text().split()]
    assert len(pids) >= 2  # the helper (and the loader's workers, where they still run), the script
    assert [p for p in pids if not _ends(p, within_s=2.0)] == []
    # /dev/shm as it was: torch's files of the run's processes, unstall's in this test's folder
    # (other tests beside this one make and remove files of their own in /dev/shm)
    new = set(os.listdir("/dev/shm")) - before
    assert {n for n in new if any(n.startswith(f"torch_{p}_") for p in pids)} == set()
    assert os.listdir(own_shm_dir) == []


def test_a_script_that_ends_but_leaves_a_process_holding_its_output_is_ended_too(tmp_path):
    """The script exits, a server it started keeps its output open: past the time the run is
    said to have ended, and the server it left goes (SIGINT ignored: SIGKILL)."""
    from unstall.analysis.measure.script.hang import RunTimedOut, run_script

    pid_file = tmp_path / "pid"
    script = (
        "import subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(3600)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
        "print('server started', flush=True)\n"
    )
    with pytest.raises(RunTimedOut) as caught:
        run_script([sys.executable, "-c", script], dict(os.environ), 3.0, str(tmp_path), "cold")
    message = str(caught.value)
    assert "the cold run of" in message and "ended (exit 0), but processes it started" in message
    assert "were still running after 3 s and were stopped" in message
    assert "server started" in message
    pid = int(pid_file.read_text())
    assert _ends(pid, within_s=2.0)  # SIGKILLed: its output closes a moment before it is gone


def _ends(pid: int, within_s: float) -> bool:
    """Whether ``pid`` is gone or a zombie (whoever adopted it may reap it late) in time."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.NoSuchProcess):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                time.sleep(0.02)
                continue
        return True
    return False
