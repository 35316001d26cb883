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
