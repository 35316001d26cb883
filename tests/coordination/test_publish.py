"""Published batches: collated straight into a group file, mapped copy-on-write, recycled."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import default_collate

from unstall.coordination.publish import FREE_PREFIX, PublishTarget, map_batch, recycle


def _samples(n: int = 6):
    """Images of 30 KB: a batch of them goes into the file (small batches travel inline)."""
    g = torch.Generator().manual_seed(0)
    return [
        (torch.randint(0, 255, (3, 100, 100), dtype=torch.uint8, generator=g), i) for i in range(n)
    ]


def _publish(folder, name, samples, collate_fn=default_collate):
    target = PublishTarget(os.path.join(folder, name))
    assert target.collate(samples, collate_fn) is target, target.error
    return target


def test_round_trip_equals_default_collate(tmp_path):
    samples = _samples()
    _publish(tmp_path, "p0-0", samples)
    images, labels = map_batch(str(tmp_path / "p0-0"))
    want = default_collate(samples)
    assert torch.equal(images, want[0]) and torch.equal(labels, want[1])
    assert images.dtype == torch.uint8 and labels.tolist() == list(range(6))
    assert [n for n in os.listdir(tmp_path)] == ["p0-0"]  # no temporary file left


def test_dicts_arrays_and_a_custom_collate_fn(tmp_path):
    big = np.arange(40_000, dtype=np.float32)  # 160 KB: goes into the file, not inline
    samples = [{"x": big + i, "id": i, "name": f"s{i}"} for i in range(3)]
    _publish(tmp_path, "p0-1", samples)
    out = map_batch(str(tmp_path / "p0-1"))
    assert torch.equal(out["x"], torch.stack([torch.from_numpy(big + i) for i in range(3)]))
    assert out["id"].tolist() == [0, 1, 2] and out["name"] == ["s0", "s1", "s2"]

    def halves(batch):  # makes new, bigger tensors than its samples: moved in after collating
        return torch.cat([torch.as_tensor(s["x"]) for s in batch]).double() / 2

    _publish(tmp_path, "p0-2", samples, halves)
    assert torch.equal(map_batch(str(tmp_path / "p0-2")), halves(samples))


def test_an_edit_in_one_member_reaches_no_other(tmp_path):
    samples = _samples()
    _publish(tmp_path, "p0-0", samples)
    mine, _ = map_batch(str(tmp_path / "p0-0"))
    mine.zero_()  # copy-on-write: this process's pages only
    theirs, _ = map_batch(str(tmp_path / "p0-0"))
    assert torch.equal(theirs, default_collate(samples)[0])


def test_a_mapped_batch_is_not_recycled_a_released_one_is(tmp_path):
    _publish(tmp_path, "p0-0", _samples())
    held = map_batch(str(tmp_path / "p0-0"))
    free = str(tmp_path / f"{FREE_PREFIX}1")
    assert recycle(str(tmp_path / "p0-0"), free, busy_unlink=False) == "busy"
    assert os.path.exists(tmp_path / "p0-0")
    del held
    gc.collect()
    assert recycle(str(tmp_path / "p0-0"), free, busy_unlink=False) == "reused"
    assert os.listdir(tmp_path) == [f"{FREE_PREFIX}1"]
    target = _publish(tmp_path, "p0-7", _samples(4))  # the free file takes the next batch
    assert target.recycled and os.listdir(tmp_path) == ["p0-7"]
    assert map_batch(str(tmp_path / "p0-7"))[1].tolist() == [0, 1, 2, 3]


def test_a_busy_batch_far_below_the_floor_is_unlinked_and_stays_valid(tmp_path):
    samples = _samples()
    _publish(tmp_path, "p0-0", samples)
    held, _ = map_batch(str(tmp_path / "p0-0"))
    assert recycle(str(tmp_path / "p0-0"), str(tmp_path / "f-x"), busy_unlink=True) == "unlinked"
    assert os.listdir(tmp_path) == []
    assert torch.equal(held, default_collate(samples)[0])  # its holder keeps its pages


def test_a_late_reader_of_a_recycled_file_sees_it_lost_the_race(tmp_path):
    _publish(tmp_path, "p0-0", _samples())
    assert recycle(str(tmp_path / "p0-0"), str(tmp_path / "f-1"), busy_unlink=False) == "reused"
    _publish(tmp_path, "p0-9", _samples(2))  # the same file, now batch 9
    # A reader that opened p0-0 just before it was recycled holds this very inode:
    os.link(tmp_path / "p0-9", tmp_path / "p0-0")
    with pytest.raises(FileNotFoundError, match="another batch"):
        map_batch(str(tmp_path / "p0-0"))
    with pytest.raises(FileNotFoundError):
        map_batch(str(tmp_path / "p0-5"))  # reclaimed: gone


def test_a_batch_mapped_in_another_process_is_busy_until_it_exits(tmp_path):
    _publish(tmp_path, "p0-0", _samples())
    code = (
        "import sys; from unstall.coordination.publish import map_batch; "
        f"b = map_batch({str(tmp_path / 'p0-0')!r}); print('mapped', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "mapped"
        assert recycle(str(tmp_path / "p0-0"), str(tmp_path / "f-1"), busy_unlink=False) == "busy"
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    assert recycle(str(tmp_path / "p0-0"), str(tmp_path / "f-1"), busy_unlink=False) == "reused"


def test_no_room_hands_the_batch_over_privately(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    samples = _samples()
    target = PublishTarget(str(tmp_path / "p0-0"))
    out = target.collate(samples, default_collate)
    assert out is not target and "No space left" in target.error
    assert torch.equal(out[0], default_collate(samples)[0])
    assert os.listdir(tmp_path) == []  # nothing half-written left


def test_a_file_that_is_not_a_batch_is_refused(tmp_path):
    (tmp_path / "p0-0").write_bytes(b"x" * 100)
    with pytest.raises(FileNotFoundError, match="another batch"):
        map_batch(str(tmp_path / "p0-0"))
    (tmp_path / "p0-1").write_bytes(b"x")
    with pytest.raises(ValueError, match="not a published batch"):
        map_batch(str(tmp_path / "p0-1"))
