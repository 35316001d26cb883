"""`unstall cache list` and `unstall cache clear`."""

from __future__ import annotations

import os

import unstall
from unstall.cache import list_caches
from unstall.cli import main


def test_list_and_clear(make_dataset, capsys, shm_namespace, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")  # one table row per line
    ds = make_dataset(10, 100)
    assert main(["cache", "list"]) == 0
    assert "no unstall cache segments" in capsys.readouterr().out
    cache = unstall.Cache(1.0, name="cli")
    layer = cache.bind(ds)
    layer.fetch(ds, [0, 1, 2])
    assert main(["cache", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{shm_namespace}cli" in out and "3 / 10" in out and str(os.getpid()) in out
    assert main(["cache", "clear", f"{shm_namespace}cli"]) == 1  # in use
    assert "a live process uses it" in capsys.readouterr().out
    assert main(["cache", "clear", "--force", f"{shm_namespace}cli"]) == 0
    assert f"removed {shm_namespace}cli" in capsys.readouterr().out
    assert list_caches() == []
    assert layer.fetch(ds, [1, 2]) == ds.fetch([1, 2])  # users keep their mapping
    cache.close()
    assert main(["cache", "clear"]) == 0
    assert "nothing to remove" in capsys.readouterr().out


def test_list_and_clear_show_the_disk_tier(make_dataset, capsys, shm_namespace, monkeypatch):
    monkeypatch.setenv("COLUMNS", "250")
    ds = make_dataset(10, 100)
    with unstall.Cache(ram=300, disk=1.0, name="both") as cache:
        layer = cache.bind(ds)
        assert layer.fetch(ds, range(10)) == ds.fetch(range(10))
        assert main(["cache", "list"]) == 0
        out = capsys.readouterr().out
        rows = [line for line in out.splitlines() if f"{shm_namespace}both" in line]
        assert len(rows) == 2 and "ram" in rows[0] and "3 / 10" in rows[0]
        assert "disk" in rows[1] and "7 / 10" in rows[1] and "700 B" in rows[1]
    assert [c["tier"] for c in list_caches()] == ["disk"]  # the RAM tier left with its job
    assert main(["cache", "clear"]) == 0
    assert f"removed {shm_namespace}both (disk)" in capsys.readouterr().out
    assert list_caches() == []
