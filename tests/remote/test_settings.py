"""`Remote`: checked at construction, from a config's dict too; the wire form; joining."""

from __future__ import annotations

import pytest
import torch

import unstall
from unstall.remote.settings import parse_bytes
from unstall.remote.wire import from_wire, to_wire


def test_defaults_and_the_dict_a_config_holds():
    r = unstall.Remote.of({"address": "head:6379", "workers": 4, "max_bytes_in_flight": "64MiB"})
    assert (r.backend, r.address, r.workers, r.tasks_per_worker) == ("ray", "head:6379", 4, 2)
    assert r.max_bytes_in_flight == 64 * 2**20
    assert unstall.Remote.of(r) is r
    assert parse_bytes("1.5GB") == 1_500_000_000 and parse_bytes(4096) == 4096


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"backend": "dask"}, "backend='dask'"),
        ({"workers": 0}, "workers=0"),
        ({"workers": 2.0}, "workers=2.0"),
        ({"cpus_per_worker": -1}, "cpus_per_worker=-1"),
        ({"resources": {"prep": "x"}}, "resources="),
        ({"tasks_per_worker": 0}, "tasks_per_worker=0"),
        ({"max_bytes_in_flight": "lots"}, "max_bytes_in_flight='lots'"),
        ({"max_bytes_in_flight": 0}, "max_bytes_in_flight=0"),
        ({"timeout_s": 0}, "timeout_s=0"),
        ({"fallback": "retry"}, "fallback='retry'"),
        ({"wait_up_s": -1}, "wait_up_s=-1"),
        ({"address": 6379}, "address=6379"),
    ],
)
def test_a_bad_setting_is_named(kwargs, named):
    with pytest.raises(ValueError, match=named.replace("(", r"\(").replace("[", r"\[")):
        unstall.Remote(**kwargs)


def test_unknown_keys_and_wrong_types_are_named():
    with pytest.raises(ValueError, match=r"unknown keys \['nodes'\]"):
        unstall.Remote.of({"nodes": 3})
    with pytest.raises(ValueError, match=r"must be an unstall\.Remote"):
        unstall.Remote.of("head:6379")


def test_a_loader_checks_remote_at_construction(monkeypatch):
    """No cluster named and none in the environment: unstall starts none, and says how."""
    pytest.importorskip("ray")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    ds = torch.utils.data.TensorDataset(torch.arange(8))
    with pytest.raises(ValueError, match="never starts one"):
        unstall.DataLoader(ds, batch_size=2, remote=unstall.Remote())
    with pytest.raises(ValueError, match="workers=0"):
        unstall.DataLoader(ds, batch_size=2, remote={"workers": 0})
    with pytest.raises(ValueError, match="cannot be combined"):
        unstall.DataLoader(ds, batch_size=2, remote={"workers": 1}, coordinate="g")
    with pytest.raises(ValueError, match=r"remote=.*map-style"):
        unstall.DataLoader(Stream(), batch_size=2, remote=unstall.Remote())


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(4))


def test_the_wire_form_round_trips_and_counts_bytes():
    batch = {
        "x": torch.arange(12, dtype=torch.uint8).view(3, 4),
        "y": [torch.tensor([1.5, 2.5]), "name"],
        "t": (torch.ones(2, dtype=torch.bfloat16), b"raw"),
    }
    payload, nbytes = to_wire(batch)
    assert nbytes == 12 + 8 + 4 + 3
    back = from_wire(payload)
    assert torch.equal(back["x"], batch["x"]) and back["y"][1] == "name"
    assert torch.equal(back["y"][0], batch["y"][0]) and back["t"][1] == b"raw"
    assert back["t"][0].dtype == torch.bfloat16
    back["x"][0, 0] = 99  # writable, and not the original's memory
    assert batch["x"][0, 0] == 0
