"""The process's environment is read in one place, `unstall.machine`: torchrun's variables
(the rank, the place in the job), Ray's ``$RAY_ADDRESS``, and the count of cores (affinity
capped by a cgroup's quota). These scans fail when another module reads one itself."""

from __future__ import annotations

import ast
import pathlib
import sys
import types

import pytest

from unstall import machine

ROOT = pathlib.Path(__file__).resolve().parent.parent / "unstall"
#: The one module that reads them.
OWNER = ROOT / "machine.py"
#: torchrun's and Ray's variables: no string spelling one outside `OWNER` (an environment
#: written for a child process, a dict literal's key or a keyword, is not a read).
VARIABLES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "RAY_ADDRESS",
}
#: Calls that count cores: `machine.cores_available` is the one counter (affinity and quota).
COUNTERS = {"cpu_count", "sched_getaffinity", "process_cpu_count"}


def environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each string spelling a torchrun or Ray variable, but a dict key."""
    keys = {id(k) for n in ast.walk(tree) if isinstance(n, ast.Dict) for k in n.keys if k}
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and n.value in VARIABLES
        and id(n) not in keys
    ]


def core_counts(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, name) of each call or import of a core counter (``os.cpu_count()``,
    ``os.sched_getaffinity``, ``multiprocessing.cpu_count``, ``psutil.cpu_count``...)."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Attribute) and n.attr in COUNTERS:
            out.append((n.lineno, n.attr))
        elif isinstance(n, ast.ImportFrom):
            out += [(n.lineno, a.name) for a in n.names if a.name in COUNTERS]
    return out


def _scan(find) -> dict[str, list[tuple[int, str]]]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        if path == OWNER:
            continue
        hits = find(ast.parse(path.read_text(), str(path)))
        if hits:
            found[str(path.relative_to(ROOT.parent))] = hits
    return found


def test_torchrun_and_ray_variables_are_read_only_by_the_machine_module():
    assert _scan(environment_reads) == {}


def test_cores_are_counted_only_by_the_machine_module():
    assert _scan(core_counts) == {}


def test_the_scans_see_what_they_look_for():
    """Each way of reading that the scans above must catch, caught (and a child's
    environment, written as a dict literal, let through)."""
    code = ast.parse(
        "import os, multiprocessing\n"
        "from os import sched_getaffinity\n"
        "a = os.environ.get('LOCAL_WORLD_SIZE')\n"
        "b = os.environ['RAY_ADDRESS']\n"
        "c = os.getenv('RANK')\n"
        "d = [os.environ.get(k) for k in ('MASTER_ADDR', 'MASTER_PORT')]\n"
        "e = os.cpu_count()\n"
        "f = multiprocessing.cpu_count()\n"
        "g = len(os.sched_getaffinity(0))\n"
        "child = {'LOCAL_WORLD_SIZE': '2'}\n"
    )
    assert environment_reads(code) == [
        (3, "LOCAL_WORLD_SIZE"),
        (4, "RAY_ADDRESS"),
        (5, "RANK"),
        (6, "MASTER_ADDR"),
        (6, "MASTER_PORT"),
    ]
    assert sorted(core_counts(code)) == [
        (2, "sched_getaffinity"),
        (7, "cpu_count"),
        (8, "cpu_count"),
        (9, "sched_getaffinity"),
    ]


def _fake_group(monkeypatch, rank: int | None) -> None:
    """torch.distributed as `machine.rank_if_any` sees it: a group up at ``rank`` (None: no
    group), without importing torch."""
    up = rank is not None
    dist = types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: up, get_rank=lambda: rank
    )
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)


@pytest.mark.parametrize(
    ("group", "known", "env", "expected"),
    [
        (3, 1, {"RANK": "5", "LOCAL_RANK": "2"}, 3),  # the group's rank first
        (None, 1, {"RANK": "5", "LOCAL_RANK": "2"}, 1),  # then one recorded while it was up
        (None, None, {"RANK": "5", "LOCAL_RANK": "2"}, 5),  # then torchrun's $RANK
        (None, None, {"LOCAL_RANK": "2"}, 2),  # then $LOCAL_RANK
        (None, None, {}, None),  # not a distributed job
        (None, None, {"RANK": "x"}, None),  # not a number: not a rank
    ],
)
def test_one_rank_with_one_precedence(monkeypatch, group, known, env, expected):
    _fake_group(monkeypatch, group)
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert machine.rank_if_any(known) == expected
    if known is None:
        assert machine.rank() == (expected or 0)


def test_rank_is_zero_outside_a_distributed_job(monkeypatch):
    _fake_group(monkeypatch, None)
    for name in ("RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert machine.rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert machine.rank() == 1


def test_the_job_on_this_node_from_torchrun(monkeypatch):
    for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    assert (machine.torchrun_job(), machine.local_world_size()) == ("", 1)
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.2")
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert (machine.torchrun_job(), machine.local_world_size()) == ("10.0.0.2|29500|", 4)
    place = {"RANK": "5", "WORLD_SIZE": "8", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert machine.torchrun_place(place) == {**place, "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    with pytest.raises(RuntimeError, match=r"\$WORLD_SIZE is not set"):
        machine.torchrun_place({"RANK": "0"})


def test_ray_address_is_read_when_asked(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert machine.ray_address() is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert machine.ray_address() == "10.0.0.1:6379"


def test_cpu_set_is_the_affinity_and_counts_the_cores():
    mine = machine.cpu_set()
    assert mine and all(isinstance(c, int) for c in mine)
    assert machine.cores_available() <= len(mine) <= machine.cpus_installed()
