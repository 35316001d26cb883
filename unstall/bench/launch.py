"""`bench launch`: what `unstall run` costs outside the script itself.

Runs ``examples/train_min.py`` plainly and under ``unstall run`` in alternating
pairs (median of 5 each with --quick); the ratio is the plain wall time over the
`unstall run` wall time (goal >= 0.98: under 2 % slower, unstall's loader and
its report included). Also timed, median of the same number of repeats: a tiny
loader script (almost all fixed cost: the launcher, loading unstall's loader, the
report), the launcher alone (``unstall run -- true``, which runs ``true`` as a
child) and the start-up hook in a process that imports torch and makes no loader.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from unstall.bench.harness import EXAMPLES, BenchResult, check_example, rotate, script_env

DESCRIPTION = (
    "unstall run's cost per launch: train_min.py plain vs under unstall run (goal >= 0.98)"
)

#: A script whose run is almost all fixed cost: torch's import, one small loader, exit.
TINY = (
    "import torch\n"
    "from torch.utils.data import DataLoader\n"
    "assert sum(len(b) for b in DataLoader(list(range(64)), batch_size=8)) == 64\n"
)

#: The repository's example script (the bench runs from a source checkout).
SCRIPT = EXAMPLES / "train_min.py"

#: The rows, in order: ``train`` (the headline: `SCRIPT`), ``tiny`` (`TINY`), ``true`` (the
#: launcher alone) and ``torch`` (the start-up hook in a process that imports torch).
CASES = ("train", "tiny", "true", "torch")


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one run; cpu is user + system time of the process and of
    the children it waited for (its loader's workers), which a busy machine disturbs less."""
    start = time.perf_counter()
    with subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        err = proc.stderr.read() if proc.stderr is not None else ""
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({proc.returncode}): {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def _pairs(
    plain: list[str],
    under: list[str],
    repeats: int,
    console: Any,
    what: str,
    env: dict[str, str],
    under_env: dict[str, str] | None = None,
) -> tuple[list[tuple[float, float]], list[tuple[float, float]]]:
    """``(wall, cpu)`` of ``plain`` and ``under`` runs, alternating which goes first."""

    def said(i: int, _order: list[str], last: dict[str, tuple[float, float]]) -> None:
        if console is not None:
            (wa, ca), (wb, cb) = last["plain"], last["under"]
            console.print(
                f"  {what} {i + 1}/{repeats}: plain {wa:.3f} s wall, {ca:.3f} s cpu;"
                f" unstall {wb:.3f} s wall, {cb:.3f} s cpu"
            )

    sides = {
        "plain": lambda: _timed(plain, env),
        "under": lambda: _timed(under, under_env or env),
    }
    runs = rotate(sides, repeats, said)
    return runs["plain"], runs["under"]


def run(
    *,
    quick: bool,
    console: Any = None,
    repeats: int | None = None,
    script_args: tuple[str, ...] = (),
    fresh_cache: bool = True,
    cases: tuple[str, ...] = CASES,
) -> BenchResult:
    """``cases``: the rows (of `CASES`, ``train`` first: the headline; the tests run two).
    ``fresh_cache``: compile every module (torch's too) into a fresh folder, filled by a
    warm-up run of each command, as the bench's figures need; False (tests of the bench's
    shape, whose figures are not asserted): the processes use the compiled modules already
    there, as their environment says, and nothing is warmed up (compiling torch again took
    a third of a tiny run)."""
    check_example(SCRIPT, "launch")
    if cases[:1] != ("train",) or not set(cases) <= set(CASES) or len(set(cases)) < len(cases):
        raise ValueError(f"cases={cases!r}: train first, then any of {CASES[1:]}")
    repeats = repeats or (5 if quick else 11)
    env = script_env()
    if not fresh_cache:
        return _measure(env, repeats, console, script_args, cases, warm_up=False)
    # compiled modules cached, as in any install (a checkout with $PYTHONDONTWRITEBYTECODE
    # would compile unstall's sources in every process and measure that instead)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    pycache = tempfile.mkdtemp(prefix="unstall-bench-launch-")
    env["PYTHONPYCACHEPREFIX"] = pycache
    try:
        return _measure(env, repeats, console, script_args, cases)
    finally:
        shutil.rmtree(pycache, ignore_errors=True)


def _measure(
    env: dict[str, str],
    repeats: int,
    console: Any,
    script_args: tuple[str, ...],
    cases: tuple[str, ...],
    *,
    warm_up: bool = True,
) -> BenchResult:
    from unstall.launch.command import run_env

    py, run_cmd = sys.executable, [sys.executable, "-m", "unstall", "run", "--"]
    train = [py, str(SCRIPT), *script_args]
    tiny = [py, "-c", TINY]
    if warm_up:
        _timed(train, env)  # warm-up: the page cache holds torch for both
        _timed([*run_cmd, *tiny], env)  # and unstall's compiled modules are cached
    hooked = run_env(base=env, root_pid=os.getpid())  # not the root: prints no summary
    hooked["UNSTALL_RUN_DIR"] = os.path.join(hooked["UNSTALL_RUN_DIR"], "never-made")
    torch = [py, "-c", "import torch"]
    # each case: its row's label, its progress lines' name, its plain command, that command
    # under `unstall run` and the environment of that side (None: ``env``; ``torch``: the same
    # command, the start-up hook set in its environment)
    commands = {
        "train": ("python examples/train_min.py", "train_min.py", train, [*run_cmd, *train], None),
        "tiny": (
            "a tiny loader script (the fixed cost)",
            "tiny loader",
            tiny,
            [*run_cmd, *tiny],
            None,
        ),
        "true": ("true (the launcher alone)", "true", ["true"], [*run_cmd, "true"], None),
        "torch": ("python -c 'import torch' (start-up hook)", "import torch", torch, torch, hooked),
    }
    rows: list[dict[str, Any]] = []

    def add(
        case: str, a: list[tuple[float, float]], b: list[tuple[float, float]]
    ) -> tuple[float, float]:
        wall_a, wall_b = (statistics.median(w for w, _ in runs) for runs in (a, b))
        cpu_a, cpu_b = (statistics.median(c for _, c in runs) for runs in (a, b))
        rows.append(
            {
                "case": case,
                "plain_ms": round(1e3 * wall_a, 1),
                "unstall_ms": round(1e3 * wall_b, 1),
                "ratio": round(wall_a / wall_b, 4),
                "plain_cpu_ms": round(1e3 * cpu_a, 1),
                "unstall_cpu_ms": round(1e3 * cpu_b, 1),
                "cpu_ratio": round(cpu_a / cpu_b, 4) if cpu_b else None,
            }
        )
        return wall_a, wall_b

    walls: dict[str, tuple[float, float]] = {}
    for case in cases:
        label, name, plain, under, under_env = commands[case]
        a, b = _pairs(plain, under, repeats, console, name, env, under_env)
        walls[case] = add(label, a, b)
    plain_s, under_s = walls["train"]
    ratio = plain_s / under_s
    return BenchResult(
        name="launch",
        ratio=ratio,
        baseline={"command": "python examples/train_min.py", "wall_s": round(plain_s, 3)},
        unstall={
            "command": "unstall run -- python examples/train_min.py",
            "wall_s": round(under_s, 3),
        },
        rows=rows,
        detail={"goal": 0.98, "repeats": repeats},
        notes=[
            f"median of {repeats} alternating runs each; ratio = plain wall / unstall run wall "
            "(goal >= 0.98: under 2 % added per launch); cpu: user + system seconds of the "
            "process and its loader workers (less disturbed by a busy machine than wall)"
        ],
    )
