"""`unstall run` costs nothing outside the script: the launcher imports no torch, a
process that imports torch but makes no loader loads none of unstall's machinery,
and a command with no Python in it leaves no folder behind."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "numpy", "rich", "PIL", "obstore", "matplotlib", "aiohttp", "psutil")


def unstall_run(*command: str, tmp_path: Path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    return subprocess.run(
        [sys.executable, "-m", "unstall", "run", "--", *command],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def launcher_modules(tmp_path: Path, *options: str) -> set[str]:
    """The modules loaded at the moment `unstall run OPTIONS` would become the command."""
    code = (
        "import os, sys\n"
        "def execve(path, argv, env):\n"
        "    print(' '.join(sorted(sys.modules)), flush=True)\n"
        "    os._exit(0)\n"
        "os.execve = execve\n"
        "from unstall.cli import main\n"
        f"main(['run', *{list(options)!r}, '--', sys.executable, '-c', 'pass'])\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return set(done.stdout.split())


def test_the_launcher_imports_nothing_heavy_before_it_execs(tmp_path):
    modules = launcher_modules(tmp_path)
    assert {"unstall.cli.run", "unstall.launch.command"} <= modules
    assert sorted(m for m in modules if m.split(".")[0] in HEAVY) == []
    assert sorted(m for m in modules if m.startswith("unstall.")) == [
        "unstall.cli",
        "unstall.cli.args",
        "unstall.cli.main",  # the parser and entry point (`unstall.cli` re-exports them)
        "unstall.cli.run",
        "unstall.launch",
        "unstall.launch.command",
        "unstall.lazy",  # the package's lazy names (`unstall.lazy`: the standard library only)
    ]


def test_a_config_file_is_checked_without_torch(tmp_path):
    """``--config`` is read and checked before the command starts (a bad file fails there),
    without torch: its import was 2.4 s of every such launch."""
    import json

    config = tmp_path / "c.json"
    config.write_text(json.dumps({"kwargs": {"num_workers": 2, "cache": "64MiB"}}))
    modules = launcher_modules(tmp_path, "--config", str(config))
    assert "unstall.loader.config_file" in modules
    # the file's cache size is checked by building its `unstall.Cache` (numpy, psutil): no torch
    assert {m.split(".")[0] for m in modules} & set(HEAVY) <= {"numpy", "psutil"}
    config.write_text(json.dumps({"kwargs": {"batch_size": 7}}))
    done = subprocess.run(
        [sys.executable, "-m", "unstall", "run", "--config", str(config), "--", "true"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0 and "batch_size" in done.stdout + done.stderr


def test_a_command_that_is_not_python_leaves_nothing_behind(tmp_path):
    for command, code in ((["true"], 0), (["sh", "-c", "exit 3"], 3)):
        done = unstall_run(*command, tmp_path=tmp_path)
        assert done.returncode == code, done.stderr
        assert list(tmp_path.iterdir()) == [], done.stderr


def test_importing_torch_loads_no_unstall_machinery_until_dataloader_is_named(tmp_path):
    code = (
        "import sys, torch, torch.utils.data\n"
        "before = sorted(m for m in sys.modules if m.startswith('unstall.loader'))\n"
        "from torch.utils.data import DataLoader\n"
        "print(before, DataLoader.__module__, torch.utils.data.dataloader.DataLoader is DataLoader)"
    )
    done = unstall_run(sys.executable, "-c", code, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[]", "unstall.loader.dataloader", "True"]
    assert "made no DataLoader" in done.stderr
    assert list(tmp_path.iterdir()) == []
    mine = "import sys, torch; print(sorted(m for m in sys.modules if 'unstall' in m))"
    plain = subprocess.run(  # a process importing torch alone: nothing of unstall's loader
        [sys.executable, "-c", mine],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, **_run_env(tmp_path)},
    )  # fmt: skip
    loaded = "['unstall', 'unstall.launch', 'unstall.launch.boot', 'unstall.lazy']"
    assert plain.stdout.strip() == loaded


def _run_env(tmp_path: Path) -> dict[str, str]:
    from unstall.launch.command import run_env

    env = run_env(base={"PYTHONPATH": os.environ.get("PYTHONPATH", "")}, root_pid=1)
    env["UNSTALL_RUN_DIR"] = str(tmp_path / "never-made")
    return env


def test_a_shell_script_that_starts_python_gets_its_summary(tmp_path):
    train = tmp_path / "train.sh"
    loader = (
        "import torch\n"
        "from torch.utils.data import DataLoader\n"
        "print(sum(len(b) for b in DataLoader(list(range(20)), batch_size=8)))\n"
    )
    train.write_text(f"#!/bin/sh\n{sys.executable} -c '{loader}'\n")
    done = unstall_run("sh", str(train), tmp_path=tmp_path)
    assert (done.returncode, done.stdout.strip()) == (0, "20"), done.stderr[-2000:]
    assert "where the training loop waited for data" in done.stderr  # printed by the launcher
    assert "1 x 3" in done.stderr  # one epoch of 3 batches
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.sh"]
