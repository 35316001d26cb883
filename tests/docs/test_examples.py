"""Every example of the README and the docs works: Python blocks run, shell blocks parse.

Python blocks run one per process, in a folder holding ``data/train`` (a tiny ImageFolder
made here), so an example reads the data the docs name. Each process is forked from a server
that imported torch once (`block_runner`): as isolated as ``python -c BLOCK``, a third of the
time. A block that cannot run in CI (S3, a
GPU, several nodes, a real dataset) says why in a ``<!-- not-run: REASON -->`` comment just
before it; those stay few. Each ``unstall ...`` line of a shell block is parsed by the
command's own parser, so a renamed option or a subcommand that does not exist fails here.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.docs.block_runner import BlockRunner
from tests.docs.markdown_blocks import ROOT, all_blocks, unstall_commands

BLOCKS = all_blocks()
PYTHON = [b for b in BLOCKS if b.lang == "python"]
SHELL = [b for b in BLOCKS if b.lang in ("bash", "sh", "shell")]
#: at most this many Python examples may be left unrun (each with its reason)
MAX_NOT_RUN = 6


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder with ``data/train``: 4 classes x 6 JPEGs of 96x72 (random, seeded)."""
    root = tmp_path_factory.mktemp("examples")
    rng = np.random.default_rng(0)
    for c in range(4):
        folder = root / "data" / "train" / f"class_{c}"
        folder.mkdir(parents=True)
        for i in range(6):
            pixels = rng.integers(0, 256, (72, 96, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"img_{i}.jpg", quality=85)
    return root


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BlockRunner]:
    """The module's block runner (one server; each block still gets a process of its own)."""
    runner = BlockRunner(_env(), tmp_path_factory.mktemp("block-logs"))
    yield runner
    runner.close()


def test_the_docs_have_examples_and_few_are_left_unrun():
    assert len(PYTHON) >= 10 and len(SHELL) >= 10, (len(PYTHON), len(SHELL))
    skipped = [b.id for b in PYTHON if b.not_run]
    assert len(skipped) <= MAX_NOT_RUN, skipped
    readme = [b for b in PYTHON if b.path.name == "README.md"]
    assert not any(b.not_run for b in readme)  # the README's examples always run


@pytest.mark.parametrize("block", [b for b in PYTHON if not b.not_run], ids=lambda b: b.id)
def test_python_example_runs(block, workdir, runner):
    done = runner.run(block.id, block.code, cwd=workdir, env=_env(), timeout=110)
    assert done.returncode == 0, f"{block.id} failed:\n{done.stderr[-3000:]}"


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.id)
def test_shell_example_parses(block):
    from unstall.cli import build_parser

    for line in unstall_commands(block.code):
        argv = shlex.split(line)[1:]
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as exc:  # argparse's way of saying no
            pytest.fail(f"{block.id}: `{line}` does not parse (exit {exc.code})")
        assert getattr(args, "run", None), f"{block.id}: `{line}` names no subcommand"


def test_every_unstall_subcommand_is_shown_somewhere():
    from unstall.cli import SUBCOMMANDS

    shown = {shlex.split(c)[1] for b in SHELL for c in unstall_commands(b.code)}
    missing = {s.replace("_", "-") for s in SUBCOMMANDS} - shown
    assert not missing, missing


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env
