"""Errors reach the training loop naming the sample; a dead worker is reported, not hung on."""

from __future__ import annotations

import gc
import io
import os
import signal
import time

import pytest
import torch
from PIL import Image

import unstall
from tests.conftest import IdDataset
from unstall.errors import SampleError


class FailsAt(IdDataset):
    def __init__(self, n: int, bad: int):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, index: int) -> int:
        if index == self.bad:
            raise ValueError(f"broken record {index}")
        return index


class KillsWorkerAt(IdDataset):
    def __init__(self, n: int, bad: int):
        super().__init__(n)
        self.bad = bad

    def __getitem__(self, index: int) -> int:
        if index == self.bad and torch.utils.data.get_worker_info() is not None:
            os.kill(os.getpid(), signal.SIGKILL)
        return index


@pytest.mark.parametrize("num_workers", [0, 2])
def test_exception_in_dataset_keeps_its_type_and_a_note_names_the_index(num_workers):
    loader = unstall.DataLoader(FailsAt(40, bad=13), batch_size=8, num_workers=num_workers)
    with pytest.raises(ValueError, match="broken record 13") as info:
        list(loader)
    assert not isinstance(info.value, SampleError)
    notes = getattr(info.value, "__notes__", [])
    assert any("dataset index 13" in n for n in notes), notes
    where = "DataLoader worker" if num_workers else "the main process"
    assert any(where in n for n in notes), notes
    if num_workers:  # torch's own message: the worker's traceback
        assert "worker process" in str(info.value) and "Traceback" in str(info.value)


def test_killed_worker_is_reported_within_seconds():
    loader = unstall.DataLoader(
        KillsWorkerAt(64, bad=20), batch_size=4, num_workers=2, shuffle=False
    )
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"worker .*exited unexpectedly|killed"):
        for _ in loader:
            pass
    assert time.monotonic() - start < 30


class LeavesTorchName(IdDataset):
    """At index ``bad`` a worker does what torch's ``file_descriptor`` sharing does first, make
    ``/dev/shm/torch_PID_*``, and is killed before the unlink that follows (it says the name
    in ``said``)."""

    def __init__(self, n: int, bad: int, said: str):
        super().__init__(n)
        self.bad, self.said = bad, said

    def __getitem__(self, index: int) -> int:
        if index == self.bad and torch.utils.data.get_worker_info() is not None:
            name = f"/dev/shm/torch_{os.getpid()}_4242_1"
            os.close(os.open(name, os.O_CREAT | os.O_RDWR, 0o600))
            with open(self.said, "w") as f:
                f.write(name)
            os.kill(os.getpid(), signal.SIGKILL)
        return index


def test_a_worker_killed_holding_a_torch_shared_memory_name_leaves_it_removed(tmp_path):
    # seen once in CI: a 0-byte /dev/shm/torch_16693_3689488052_1, its process gone
    said = tmp_path / "name"
    loader = unstall.DataLoader(
        LeavesTorchName(64, bad=20, said=str(said)), batch_size=4, num_workers=2
    )
    with pytest.raises(RuntimeError, match=r"worker .*exited unexpectedly|killed") as info:
        for _ in loader:
            pass
    name = said.read_text()
    del info, loader  # the iterator goes with the error's traceback
    gc.collect()
    assert name.startswith("/dev/shm/torch_") and not os.path.exists(name)


def _jpeg(seed: int) -> bytes:
    img = Image.new("RGB", (64, 48), (seed * 40 % 256, 90, 160))
    buf = io.BytesIO()
    img.save(buf, format="JPEG")
    return buf.getvalue()


@pytest.fixture
def image_dir(tmp_path):
    for c in ("cat", "dog"):
        (tmp_path / c).mkdir()
        for i in range(6):
            (tmp_path / c / f"{i:03d}.jpg").write_bytes(_jpeg(i))
    return tmp_path


@pytest.mark.parametrize("num_workers", [0, 2])
def test_corrupt_jpeg_raises_an_error_naming_the_key(image_dir, num_workers):
    (image_dir / "dog" / "003.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    loader = unstall.DataLoader(
        unstall.ImageFolder(image_dir), batch_size=4, num_workers=num_workers
    )
    with pytest.raises(SampleError, match=r"dog/003\.jpg"):
        list(loader)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_missing_file_raises_an_error_naming_the_key(image_dir, num_workers):
    dataset = unstall.ImageFolder(image_dir)
    os.remove(image_dir / "cat" / "004.jpg")
    loader = unstall.DataLoader(dataset, batch_size=5, num_workers=num_workers)
    with pytest.raises(SampleError, match=r"cat/004\.jpg") as info:
        list(loader)
    assert "not found" in str(info.value)


def test_bad_options_are_rejected_naming_the_option():
    ds = IdDataset(4)
    with pytest.raises(ValueError, match="batch_size=0"):
        unstall.DataLoader(ds, batch_size=0)
    with pytest.raises(ValueError, match="mutually exclusive with shuffle"):
        unstall.DataLoader(ds, sampler=[0, 1], shuffle=True)
    with pytest.raises(ValueError, match="batch_sampler"):
        unstall.DataLoader(ds, batch_sampler=[[0]], batch_size=2)
    with pytest.raises(ValueError, match="persistent_workers"):
        unstall.DataLoader(ds, persistent_workers=True)
    with pytest.raises(ValueError, match="num_workers option should be non-negative"):
        unstall.DataLoader(ds, num_workers=-1)
    with pytest.raises(ValueError, match="rank=2"):
        unstall.DataLoader(ds, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"cache=.*needs a map-style dataset"):
        unstall.DataLoader(Stream(), cache=object())


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))
