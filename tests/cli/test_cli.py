"""The `unstall` command: every subcommand has help; bad input gives a clear error."""

from __future__ import annotations

import json
import os
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


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["bench", "--help"], ["index", "--help"], ["cache", "list"], ["run", "--help"]],
)
def test_help_and_cache_list_import_no_torch(argv, tmp_path):
    """The parser, its help and ``cache list`` run in a tenth of a second: importing torch
    (3 s of CPU) waits for a command that uses it (the benchmarks' and shard formats' tables
    are read without their modules)."""
    code = (
        "import sys\nfrom unstall.cli import main\n"
        f"try:\n    code = main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
        "assert code == 0, code\nprint(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'torchvision')))\n"
    )
    env = {**os.environ, "UNSTALL_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_index_names_the_formats_when_one_is_unknown(tmp_path, capsys):
    assert main(["index", str(tmp_path), "--format", "nope", "--local-only"]) == 2
    assert "--format nope: not a shard format (one of tar, mds, parquet)" in capsys.readouterr().err


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


def test_cache_list_fits_80_columns(capsys, monkeypatch):
    """Long names, big tiers, several users and a shard location at COLUMNS=80: no line
    wider, each tier's figures whole on its first line (only names fold)."""
    import time

    import unstall.cache
    import unstall.data.shards.shard_files

    gib = 1 << 30
    tier = {"fingerprint": "0123456789abcdef0123", "policy": "lfu-size", "file_bytes": 0}
    rows = [
        {**tier, "tier": "ram", "name": "unstall-u1000-imagenet-train-a1b2c3d4e5f6a7b8",
         "capacity_bytes": 64 * gib, "used_bytes": 48 * gib, "items_cached": 1_000_000,
         "items": 1_281_167, "users_alive": [123456, 234567, 345678]},
        {**tier, "tier": "disk", "name": "unstall-u1000-imagenet-train-a1b2c3d4e5f6a7b8",
         "capacity_bytes": 500 * gib, "used_bytes": 120 * gib, "items_cached": 281_167,
         "items": 1_281_167, "file_bytes": 121 * gib, "users_alive": []},
        {**tier, "tier": "ram", "name": "unstall-u1000-cli", "policy": "lru",
         "capacity_bytes": 1000, "used_bytes": 300, "items_cached": 3, "items": 10,
         "users_alive": [], "kept_until": time.time() + 600},
    ]  # fmt: skip
    copies = [{"tier": "shards", "name": "3f2a9c0d1e2b", "paths": ["/x"], "path": "/x",
               "location": "s3://my-bucket/laion/train-{000000..000999}.tar",
               "file_bytes": 12 * gib, "shards": 1000, "index_bytes": 5 << 20,
               "indexes": 1000}]  # fmt: skip
    monkeypatch.setattr(unstall.cache, "list_caches", lambda everyone=False: rows)
    monkeypatch.setattr(unstall.data.shards.shard_files, "list_copies", lambda: copies)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["cache", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line.rstrip()) for line in lines) <= 80, "\n".join(lines)
    firsts = [line for line in lines if line.startswith(("ram ", "disk ", "shards "))]
    assert len(firsts) == 4, lines
    for line, figures in zip(
        firsts,
        [
            ("48.0 GiB 75%", "64.0 GiB", "1.0M / 1.3M", "123456,"),
            ("120.0 GiB 24%", "500.0 GiB", "281k / 1.3M", "none (kept)"),
            ("300 B 30%", "1000 B", "3 / 10", "none (kept"),
            ("12.0 GiB", "1,000 shards"),
        ],
        strict=True,
    ):
        assert all(f in line for f in figures), (line, figures)
    # the location folds in the name column, and reads whole down it
    k = lines.index(firsts[3])
    col = lines[k].index("s3://")
    width = len(lines[k][col:].split("  ")[0])
    folded = "".join(line[col : col + width].strip() for line in lines[k : k + 3])
    assert folded == "s3://my-bucket/laion/train-{000000..000999}.tar", lines[k:]
    assert "1,000 indexed, 12.0 GiB on disk" in " ".join(" ".join(lines[k + 3 :]).split())
