"""`unstall run`: an unchanged script, swapped in every process, its exit, signals and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from unstall.testing.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def unstall_run(*args: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "unstall", "run", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


LOADER = """
import json, sys, torch
from torch.utils.data import DataLoader, Dataset

class D(Dataset):
    def __len__(self): return 40
    def __getitem__(self, i): return i

loader = DataLoader(D(), batch_size=4, shuffle=True, num_workers=2)
ids = sorted(int(i) for b in loader for i in b)
print(json.dumps({"cls": type(loader).__module__, "ok": ids == list(range(40))}))
"""


def test_example_script_runs_unchanged_and_prints_the_summary(tmp_path):
    out = tmp_path / "run.json"
    done = unstall_run(
        "--json", str(out), "--", sys.executable, str(REPO / "examples" / "train_min.py"),
        "--epochs", "1", "--samples", "256", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "epoch 0: loss" in done.stdout
    assert "where the training loop waited for data" in done.stderr and "Shapes" in done.stderr
    (proc,) = json.loads(out.read_text())["processes"]
    (row,) = proc["loaders"]
    assert (row["batches"], row["samples"], row["num_workers"]) == (4, 256, 2)
    assert 0 <= row["wait_share"] <= 1 and row["samples_per_s"] > 0
    assert row["prep_ms_per_batch"] > 0 and row["fetch_ms_per_batch"] is None
    assert not Path(proc["argv"][0]).name.startswith("unstall")


def test_swap_reaches_child_processes_and_a_config_applies(tmp_path):
    child = script(tmp_path, "child.py", LOADER)
    parent = script(
        tmp_path,
        "parent.py",
        f"""
        import subprocess, sys
        done = subprocess.run([sys.executable, {str(child)!r}], capture_output=True, text=True)
        print(done.stdout, end="")
        sys.exit(done.returncode)
        """,
    )
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"kwargs": {"num_workers": 1}}))
    out = tmp_path / "run.json"
    done = unstall_run(
        "--json", str(out), "--config", str(config), "--", sys.executable, str(parent),
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"cls": "unstall.loader.dataloader", "ok": True}
    (proc,) = json.loads(out.read_text())["processes"]
    assert proc["argv"][0].endswith("child.py")
    assert proc["loaders"][0]["num_workers"] == 1  # the config's, not the script's 2


def test_without_unstall_run_the_script_keeps_torchs_loader(tmp_path):
    child = script(tmp_path, "child.py", LOADER)
    done = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, timeout=60)
    assert json.loads(done.stdout)["cls"] == "torch.utils.data.dataloader"


def test_failing_script_keeps_its_exit_code_and_traceback(tmp_path):
    boom = script(tmp_path, "boom.py", "def f():\n    raise RuntimeError('boom 42')\nf()\n")
    done = unstall_run("--", sys.executable, str(boom), cwd=tmp_path)
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "RuntimeError: boom 42" in done.stderr
    quits = script(tmp_path, "quits.py", "import sys\nsys.exit(7)\n")
    done = unstall_run("--", sys.executable, str(quits), cwd=tmp_path)
    assert done.returncode == 7
    assert "made no DataLoader" in done.stderr


def test_torchrun_gives_one_summary_row_per_rank(tmp_path):
    train = script(tmp_path, "train.py", LOADER)
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed beside this Python")
    out = tmp_path / "run.json"
    env_port = str(free_port())
    start = time.monotonic()
    done = unstall_run(
        "--json", str(out), "--", str(torchrun), "--nproc-per-node", "2",
        "--master-addr", "127.0.0.1", "--master-port", env_port, str(train),
        cwd=tmp_path, timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert time.monotonic() - start < 180
    procs = json.loads(out.read_text())["processes"]
    assert [p["rank"] for p in procs] == [0, 1]
    assert all(p["loaders"][0]["batches"] == 10 for p in procs)
    assert "rank 0" in done.stderr and "rank 1" in done.stderr
    assert os.path.basename(procs[0]["argv"][0]) == "train.py"


def test_a_script_making_unstalls_loader_itself_is_watched(tmp_path):
    """A script that makes ``unstall.DataLoader`` and never names torch's (no swap by
    lookup) still gets its report: the first loader it makes starts the watch."""
    body = """
    import torch, unstall

    class D(torch.utils.data.Dataset):
        def __len__(self): return 40
        def __getitem__(self, i): return i

    loader = unstall.DataLoader(D(), batch_size=4, shuffle=True, num_workers=2)
    assert sorted(int(i) for b in loader for i in b) == list(range(40))
    """
    out = tmp_path / "run.json"
    path = script(tmp_path, "direct.py", body)
    done = unstall_run("--json", str(out), "--", sys.executable, str(path), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "where the training loop waited for data" in done.stderr
    (proc,) = json.loads(out.read_text())["processes"]
    (row,) = proc["loaders"]
    assert (row["batches"], row["samples"], row["num_workers"]) == (10, 40, 2)
