"""Every sample exactly once per epoch, known order, sharding: asserted on exact ids."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import unstall
from tests.conftest import IdDataset, flatten_ids


def _epoch(loader: unstall.DataLoader) -> list[list[int]]:
    return [b.tolist() for b in loader]


@pytest.mark.parametrize("num_workers", [0, 1, 2, 4])
@pytest.mark.parametrize(("n", "batch_size"), [(64, 8), (67, 8), (10, 32)])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_per_epoch(num_workers, n, batch_size, drop_last):
    loader = unstall.DataLoader(
        IdDataset(n),
        batch_size=batch_size,
        shuffle=True,
        num_workers=num_workers,
        drop_last=drop_last,
        seed=3,
    )
    for _ in range(2):
        batches = _epoch(loader)
        ids = flatten_ids(batches)
        if drop_last:
            assert len(batches) == n // batch_size
            assert all(len(b) == batch_size for b in batches)
            assert len(ids) == (n // batch_size) * batch_size
            assert len(set(ids)) == len(ids)
        else:
            assert sorted(ids) == list(range(n))
            assert len(batches) == -(-n // batch_size)
        assert len(loader) == len(batches)


def test_order_is_the_same_for_worker_counts_and_changes_across_epochs():
    orders = {}
    for w in (0, 2):
        torch.manual_seed(4)  # torch's order: it follows torch's global RNG, as torch's loader
        loader = unstall.DataLoader(IdDataset(50), batch_size=7, shuffle=True, num_workers=w)
        orders[w] = [flatten_ids(_epoch(loader)) for _ in range(3)]
    assert orders[0] == orders[2]
    e0, e1, e2 = orders[0]
    assert e0 != e1 and e1 != e2 and e0 != e2
    assert sorted(e0) == sorted(e1) == list(range(50))


def test_set_epoch_selects_the_order():
    loader = unstall.DataLoader(IdDataset(40), batch_size=5, shuffle=True, seed=9)
    first = [_epoch(loader) for _ in range(3)]
    loader.set_epoch(1)
    assert _epoch(loader) == first[1]
    loader.set_epoch(0)
    assert _epoch(loader) == first[0]
    other_seed = unstall.DataLoader(IdDataset(40), batch_size=5, shuffle=True, seed=10)
    assert _epoch(other_seed) != first[0]


_CHILD = """
import json, sys, torch, unstall
class D(torch.utils.data.Dataset):
    def __len__(self): return 100
    def __getitem__(self, i): return i
loader = unstall.DataLoader(D(), batch_size=10, shuffle=True, seed=int(sys.argv[1]), num_workers=1)
orders = []
for epoch in map(int, sys.argv[2:]):
    loader.set_epoch(epoch)
    orders.append([b.tolist() for b in loader])
print(json.dumps(orders))
"""


def _orders_in_subprocess(seed: int, *epochs: int) -> list[list[list[int]]]:
    """Each epoch's batches in a fresh interpreter (its own torch seed, its own hash seed)."""
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, str(seed), *map(str, epochs)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout)


def test_same_order_across_separate_processes():
    # two interpreters, each epochs 2 and 3 (one process was one epoch each: three
    # interpreters' torch imports for the same checks)
    a, a3 = _orders_in_subprocess(5, 2, 3)
    b, b3 = _orders_in_subprocess(5, 2, 3)
    assert (a, a3) == (b, b3)
    assert sorted(flatten_ids(map(torch.tensor, a))) == list(range(100))
    here = unstall.DataLoader(IdDataset(100), batch_size=10, shuffle=True, seed=5)
    here.set_epoch(2)
    assert _epoch(here) == a
    assert a3 != a


@pytest.mark.parametrize("num_workers", [0, 2])
def test_shuffle_false_matches_torch(num_workers):
    for n, bs, drop_last in [(23, 4, False), (23, 4, True), (16, 16, False)]:
        ours = unstall.DataLoader(
            IdDataset(n), batch_size=bs, num_workers=num_workers, drop_last=drop_last
        )
        theirs = torch.utils.data.DataLoader(
            IdDataset(n), batch_size=bs, num_workers=num_workers, drop_last=drop_last
        )
        mine, ref = list(ours), list(theirs)
        assert len(mine) == len(ref)
        for a, b in zip(mine, ref, strict=True):
            assert torch.equal(a, b) and a.dtype == b.dtype


def test_batch_size_none_yields_single_samples_like_torch():
    ours = list(unstall.DataLoader(IdDataset(5), batch_size=None))
    theirs = list(torch.utils.data.DataLoader(IdDataset(5), batch_size=None))
    assert [int(x) for x in ours] == [int(x) for x in theirs] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_ranks_split_each_epoch_without_overlap(world_size):
    n = 60
    shards = []
    for rank in range(world_size):
        loader = unstall.DataLoader(
            IdDataset(n), batch_size=4, shuffle=True, seed=1, rank=rank, world_size=world_size
        )
        loader.set_epoch(4)
        shards.append(flatten_ids(_epoch(loader)))
    union = [i for s in shards for i in s]
    assert sorted(union) == list(range(n))  # 60 divides by 2, 3, 4: no padding, no overlap
    assert len({len(s) for s in shards}) == 1


def test_uneven_shards_are_padded_to_equal_length_like_distributed_sampler():
    n, world = 10, 4
    shards = [
        flatten_ids(
            unstall.DataLoader(IdDataset(n), batch_size=2, rank=r, world_size=world, shuffle=True)
        )
        for r in range(world)
    ]
    assert all(len(s) == 3 for s in shards)
    union = [i for s in shards for i in s]
    assert set(union) == set(range(n)) and len(union) == 12


def test_user_sampler_and_batch_sampler_are_honoured():
    sampler = list(reversed(range(9)))
    loader = unstall.DataLoader(IdDataset(9), batch_size=4, sampler=sampler)
    assert _epoch(loader) == [[8, 7, 6, 5], [4, 3, 2, 1], [0]]
    bs = [[0, 2], [4, 6], [8]]
    loader = unstall.DataLoader(IdDataset(9), batch_sampler=bs, num_workers=2)
    assert _epoch(loader) == bs


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_lookahead_names_the_next_batch_of_the_same_worker(workers):
    """With look-ahead, batches are unchanged and batch b names batch b + workers (or none)."""
    import pickle

    from unstall.loader.sampling import OrderSpec, PlanSampler

    spec = OrderSpec(num_samples=50, batch_size=8, shuffle=True, drop_last=False, seed=3)
    plain, ahead = PlanSampler(spec), PlanSampler(spec, lookahead=workers)
    for sampler in (plain, ahead):
        sampler.configure(epoch=1, start=2)
    want = list(plain)
    got = [pickle.loads(pickle.dumps(batch)) for batch in ahead]  # as workers receive them
    assert [list(b) for b in got] == want and len(want) == spec.num_batches() - 2
    for b, batch in enumerate(got):
        assert batch.ahead == (want[b + workers] if b + workers < len(want) else [])
