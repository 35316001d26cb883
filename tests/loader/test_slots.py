"""Zero-copy hand-off: exact ids through shared-memory slots, reuse, nothing left in /dev/shm."""

from __future__ import annotations

import gc
import os
import signal
import time

import psutil
import pytest
import torch

import unstall
from unstall.loader.handoff import SlotPool, leftover_slots, slot_size_for

SIDE = 128  # 3 x 128 x 128 uint8 = 48 KiB a sample: batches of 8 are large enough for slots


class Images(torch.utils.data.Dataset):
    """Sample i is an image filled with i % 251 (and i in one corner pixel pair), label i."""

    def __init__(self, n: int = 100, side: int = SIDE, grow_after: int | None = None):
        self.n, self.side, self.grow_after = n, side, grow_after

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        side = self.side * 2 if self.grow_after is not None and i >= self.grow_after else self.side
        x = torch.full((3, side, side), i % 251, dtype=torch.uint8)
        x[0, 0, 0], x[0, 0, 1] = i // 256, i % 256
        return x, i


@pytest.fixture(autouse=True)
def _no_slots_before():
    gc.collect()  # loaders of earlier tests, e.g. kept alive by a traceback
    assert leftover_slots() == []


def check_batch(x: torch.Tensor, y: torch.Tensor) -> list[int]:
    ids = y.tolist()
    assert (x[:, 0, 0, 0].long() * 256 + x[:, 0, 0, 1].long()).tolist() == ids
    assert (x[:, 1].flatten(1) == (y % 251).to(torch.uint8)[:, None]).all()
    return ids


@pytest.mark.parametrize("num_workers", [0, 1, 2, 4])
def test_exact_ids_through_slots(num_workers):
    loader = unstall.DataLoader(
        Images(), batch_size=8, shuffle=True, num_workers=num_workers, seed=5
    )
    expected = loader.order.indices(0).tolist()
    got: list[int] = []
    for x, y in loader:
        got += check_batch(x, y)
    assert got == expected
    stats = loader.stats()
    if num_workers:
        assert stats["zero_copy"]["slot_batches"] >= 13 - 3 * num_workers
        assert stats["zero_copy"]["slot_bytes"] == slot_size_for(8 * 3 * SIDE * SIDE)
    else:
        assert "zero_copy" not in stats
    assert stats["main_cpu_ms_per_batch"] > 0
    del loader
    gc.collect()
    assert leftover_slots() == []


def test_slots_recycled_over_epochs_and_bounded():
    loader = unstall.DataLoader(
        Images(), batch_size=8, shuffle=True, num_workers=2, seed=1, persistent_workers=True
    )
    for epoch in range(3):
        got = [i for x, y in loader for i in check_batch(x, y)]
        assert got == loader.order.indices(epoch).tolist()
    loader._handoff.reclaim()  # the last batch is gone too now
    pool = loader._handoff.current
    assert pool is not None and pool.all_free()
    pool.check()
    assert len(leftover_slots()) == 2 * 2 + 4  # prefetch_factor x workers + 4, no more
    loader.close()
    loader.close()  # idempotent
    assert leftover_slots() == []


def test_abandoned_epoch_then_next_epoch_is_exact():
    loader = unstall.DataLoader(Images(), batch_size=8, shuffle=True, num_workers=2, seed=2)
    it = iter(loader)
    for _ in range(6):
        check_batch(*next(it))
    del it
    got = [i for x, y in loader for i in check_batch(x, y)]
    assert got == loader.order.indices(1).tolist()
    del loader
    gc.collect()
    assert leftover_slots() == []


def test_kept_batches_stay_intact_and_dropped_ones_recycle_slots():
    loader = unstall.DataLoader(Images(160), batch_size=8, num_workers=2, seed=7, shuffle=True)
    kept = list(loader)  # every batch kept: slots stay taken, later batches take torch's path
    assert [i for x, y in kept for i in check_batch(x, y)] == loader.order.indices(0).tolist()
    first = loader.stats()["zero_copy"]
    assert first["slot_batches"] == 2 * 2 + 4 and first["slots_held"] == 2 * 2 + 4
    del kept
    got = [i for x, y in loader for i in check_batch(x, y)]  # dropped as it goes: all recycled
    assert got == loader.order.indices(1).tolist()
    second = loader.stats()["zero_copy"]
    assert second["slot_batches"] - first["slot_batches"] == 20
    assert second["slots_held"] <= 2
    loader.close()


def test_batch_bigger_than_its_slot_takes_torchs_path():
    loader = unstall.DataLoader(Images(80, grow_after=40), batch_size=8, num_workers=2)
    got = []
    for x, y in loader:
        assert x.shape[-1] == (SIDE * 2 if y[0] >= 40 else SIDE)
        got += y.tolist()
        assert x[:, 0, 0, 0].long().mul(256).add(x[:, 0, 0, 1].long()).tolist() == y.tolist()
    assert got == list(range(80))
    assert loader.stats()["zero_copy"]["spilled"] >= 1
    loader.close()


def test_no_shared_memory_left_after_worker_sigkill():
    before = {c.pid for c in psutil.Process().children()}
    loader = unstall.DataLoader(Images(400), batch_size=8, num_workers=2, seed=3, timeout=20)
    it = iter(loader)
    for _ in range(8):
        check_batch(*next(it))
    assert leftover_slots() != []
    workers = [c.pid for c in psutil.Process().children() if c.pid not in before]
    assert len(workers) == 2
    os.kill(workers[0], signal.SIGKILL)
    with pytest.raises(RuntimeError, match=r"(?i)worker"):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            next(it)
    assert leftover_slots() == []
    del it, loader
    gc.collect()
    assert leftover_slots() == []


def test_pool_unlinks_on_close_and_sweeps_dead_owners(tmp_path, monkeypatch):
    monkeypatch.setenv("UNSTALL_SHM_DIR", str(tmp_path))
    stale = tmp_path / f"unstall_slot-u{os.getuid()}-p999999999-0-0"
    stale.write_bytes(b"x")
    pool = SlotPool(3, 4096)
    assert not stale.exists()  # its owner is dead
    assert sorted(p.name for p in tmp_path.iterdir()) == [r.name for r in pool.refs]
    refs = [pool.acquire() for _ in range(4)]
    assert refs[3] is None and [r.index for r in refs[:3]] == [0, 1, 2]
    pool.release(1)
    assert pool.acquire().index == 1
    pool.close()
    pool.close()
    assert list(tmp_path.iterdir()) == []
    assert pool.acquire() is None


def test_full_shm_disables_slots_with_one_warning(monkeypatch, caplog):
    def no_space(fd, offset, size):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)  # the fork-started workers inherit it
    loader = unstall.DataLoader(Images(96), batch_size=8, num_workers=2, seed=1, shuffle=True)
    with caplog.at_level("WARNING", logger="unstall"):
        got = [i for x, y in loader for i in check_batch(x, y)]
        got += [i for x, y in loader for i in check_batch(x, y)]
    assert got == loader.order.indices(0).tolist() + loader.order.indices(1).tolist()
    warnings = [
        r.getMessage() for r in caplog.records if "zero-copy slots disabled" in r.getMessage()
    ]
    assert len(warnings) == 1 and "No space left on device" in warnings[0]
    assert loader.stats()["zero_copy"]["slot_batches"] == 0
    assert leftover_slots() == []


def test_batches_outlive_their_loader_and_its_slot_files():
    loader = unstall.DataLoader(Images(64), batch_size=8, num_workers=2, seed=3, shuffle=True)
    expected = loader.order.indices(0).tolist()
    kept = list(loader)
    assert loader.stats()["zero_copy"]["slot_batches"] > 0
    del loader
    gc.collect()
    assert leftover_slots() == []  # unlinked; the mapped memory lives while batches use it
    assert [i for x, y in kept for i in check_batch(x, y)] == expected


class Blobs(torch.utils.data.Dataset):
    """Sample i: ``(bytes, i)``, the bytes distinct per sample, 20-90 kB (raw JPEG-sized)."""

    def __len__(self) -> int:
        return 60

    def __getitem__(self, i: int):
        return blob(i), i


def blob(i: int) -> bytes:
    import random

    rng = random.Random(i)
    return f"blob {i} ".encode() + rng.randbytes(rng.randint(20_000, 90_000))


def _raw_pairs(batch):
    return [(x, y) for x, y in batch]


@pytest.mark.parametrize("persistent", [False, True])
def test_bytes_batches_through_slots_exact(persistent):
    """Fetch-only batches (lists of ``bytes``) go through slots, copied out on arrival: the
    same bytes, in order, a slot free again at once (batches kept by the consumer too)."""
    loader = unstall.DataLoader(
        Blobs(), batch_size=6, shuffle=True, seed=2, num_workers=2, collate_fn=_raw_pairs,
        persistent_workers=persistent,
    )  # fmt: skip
    for _epoch in range(2):
        kept = list(loader)  # every batch held: slots must not stay taken for bytes
        got = [y for batch in kept for _x, y in batch]
        assert got == loader.order.indices(_epoch).tolist()
        for batch in kept:
            for x, y in batch:
                assert type(x) is bytes and x == blob(y)
    stats = loader.stats()["zero_copy"]
    # the 2 x 2 tasks sent before the first batch sized the slots, and that one, take the pipe
    assert stats["slot_batches"] >= 2 * 10 - (2 * 2 + 1)
    assert stats["spilled"] == 0
    del loader, kept
    gc.collect()
    assert leftover_slots() == []
