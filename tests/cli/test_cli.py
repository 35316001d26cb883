"""The `unstall` command: every subcommand has help; bad input gives a clear error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from unstall.cli import SUBCOMMANDS, build_parser, main


def test_every_subcommand_is_registered_with_help(capsys):
    parser = build_parser()
    names = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert {s.replace("_", "-") for s in SUBCOMMANDS} <= names
    for name in names:
        with pytest.raises(SystemExit) as info:
            main([name, "--help"])
        assert info.value.code == 0
        assert "usage: unstall" in capsys.readouterr().out


def test_no_command_prints_help_and_fails(capsys):
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_bench_rejects_an_unknown_name(capsys):
    with pytest.raises(SystemExit) as info:
        main(["bench", "nope"])
    assert info.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


def test_bench_overhead_writes_json_via_the_installed_entry_point(tmp_path):
    out = tmp_path / "o.json"
    code = (
        "import sys, unstall.bench.overhead as o; "
        "o.run.__kwdefaults__['repeats'] = 1; o.run.__kwdefaults__['items'] = 20000; "
        "from unstall.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "bench", "overhead", "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "ratio (unstall / baseline)" in proc.stdout
    data = json.loads(out.read_text())
    assert data["benchmark"] == "overhead" and data["ratio"] > 0


def test_bench_without_its_extra_names_the_extra_and_the_commands(capsys, monkeypatch):
    """`unstall bench shards` where the peers' loaders are not installed: no traceback, the
    missing modules, the `bench-shards` extra and Mosaic's own command, before anything runs."""
    for module in ("webdataset", "boto3", "streaming"):
        monkeypatch.setitem(sys.modules, module, None)  # not importable, whatever is installed
    assert main(["bench", "shards", "--quick"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "`unstall bench shards` needs webdataset, boto3, streaming," in err, err
    assert "pip install 'unstall[bench-shards]' (webdataset, boto3)" in err, err
    assert "pip install --no-deps 'mosaicml-streaming>=0.9' (streaming)" in err, err
    assert "Traceback" not in err


def test_a_module_missing_while_a_bench_runs_is_named_with_its_install(capsys, monkeypatch):
    """Any benchmark: a module `NEEDS` does not list, missing at run time, is named too."""
    import types

    from unstall.bench import BENCHMARKS

    fake = types.ModuleType("fake_bench")

    def run(*, quick, console):
        raise ModuleNotFoundError("No module named 'fancylib'", name="fancylib")

    fake.run, fake.DESCRIPTION = run, "a benchmark whose library is not installed"
    monkeypatch.setitem(sys.modules, "fake_bench", fake)
    monkeypatch.setitem(BENCHMARKS, "fake", "fake_bench")
    assert main(["bench", "fake"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "`unstall bench fake` needs fancylib, not installed here" in err, err
    assert "pip install fancylib (fancylib)" in err, err
