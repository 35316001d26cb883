"""Without unstall's own options, a loader draws exactly what torch's draws: same samples,
same order, same worker seeds, same global RNG and generator state after, resume included."""

from __future__ import annotations

import pytest
import torch
import torch.utils.data

import unstall
from tests.conftest import IdDataset
from unstall.loader.swap import TorchDataLoader


class SeedOf(torch.utils.data.Dataset):
    """Sample i: (i, the process's torch.initial_seed(), a draw from torch's global RNG)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return torch.tensor([i, torch.initial_seed() % 2**62]), torch.rand(1)


def _init_12345(worker_id: int) -> None:
    torch.manual_seed(12345)


def _run(cls, *, n=10, bs=3, epochs=2, gen_seed=None, seed=0, dataset=IdDataset, **kw):
    """Seed torch, load ``epochs`` epochs, then draw once: what a seeded script sees."""
    torch.manual_seed(seed)
    gen = None if gen_seed is None else torch.Generator().manual_seed(gen_seed)
    loader = cls(dataset(n), batch_size=bs, generator=gen, **kw)
    batches = [_plain(b) for _ in range(epochs) for b in loader]
    return batches, torch.rand(1).item(), None if gen is None else gen.get_state()


def _plain(batch):
    if isinstance(batch, (list, tuple)):
        return [_plain(b) for b in batch]
    return batch.tolist() if isinstance(batch, torch.Tensor) else batch


def _same(a, b) -> None:
    (batches_a, next_a, gen_a), (batches_b, next_b, gen_b) = a, b
    assert batches_a == batches_b
    assert next_a == next_b  # torch's global RNG was drawn the same number of times
    assert (gen_a is None) == (gen_b is None)
    if gen_a is not None:
        assert torch.equal(gen_a, gen_b)  # and the user's generator too


@pytest.mark.parametrize(
    ("num_workers", "persistent"), [(0, False), (2, False), (2, True)], ids=["w0", "w2", "w2p"]
)
@pytest.mark.parametrize("gen_seed", [None, 7], ids=["global", "generator"])
def test_seeded_script_sees_torchs_samples_and_random_numbers(num_workers, persistent, gen_seed):
    kw = dict(shuffle=True, num_workers=num_workers, persistent_workers=persistent)
    ours = _run(unstall.DataLoader, gen_seed=gen_seed, epochs=3, **kw)
    _same(ours, _run(TorchDataLoader, gen_seed=gen_seed, epochs=3, **kw))
    assert ours[0][:4] != ours[0][4:8]  # epochs are shuffled anew


@pytest.mark.parametrize(
    ("n", "bs", "drop_last"), [(10, 3, False), (10, 3, True), (12, 3, False), (12, 3, True)]
)
@pytest.mark.parametrize("gen_seed", [None, 7], ids=["global", "generator"])
def test_batch_shapes_and_the_samplers_tail_draw(n, bs, drop_last, gen_seed):
    kw = dict(n=n, bs=bs, shuffle=True, drop_last=drop_last, gen_seed=gen_seed)
    _same(_run(unstall.DataLoader, **kw), _run(TorchDataLoader, **kw))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_unbatched_and_unshuffled_loading_draws_as_torch(num_workers):
    for kw in (dict(bs=None, shuffle=True), dict(bs=4, shuffle=False)):
        kw.update(num_workers=num_workers, gen_seed=3)
        _same(_run(unstall.DataLoader, **kw), _run(TorchDataLoader, **kw))


@pytest.mark.parametrize("persistent", [False, True])
def test_worker_init_fn_seeding_holds(persistent):
    """torch's test_worker_init_fn: the user's reseed in worker_init_fn is what the dataset sees."""
    loader = unstall.DataLoader(
        SeedOf(4),
        batch_size=2,
        num_workers=2,
        worker_init_fn=_init_12345,
        persistent_workers=persistent,
    )
    for _ in range(2):
        for ids_seeds, _draws in loader:
            assert ids_seeds[:, 1].tolist() == [12345, 12345]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_plain_dataset_sees_torchs_worker_seeds_and_random_stream(num_workers):
    kw = dict(n=8, bs=2, shuffle=True, num_workers=num_workers, dataset=SeedOf)
    _same(_run(unstall.DataLoader, **kw), _run(TorchDataLoader, **kw))


def test_seed_option_keeps_unstalls_per_batch_rule():
    """``seed=`` asks for unstall's order: batch b's draws follow (seed, epoch, b), any workers."""
    runs = []
    for w in (0, 2):
        loader = unstall.DataLoader(SeedOf(8), batch_size=2, shuffle=True, seed=5, num_workers=w)
        runs.append([_plain(b) for b in loader])
    assert runs[0] == runs[1]


def _resume_run(num_workers: int, gen_seed: int | None, persistent: bool, cut: int):
    """Run to ``cut`` batches, checkpoint (loader, torch RNG, generator), rebuild, finish."""
    n, bs, epochs = 11, 3, 2

    def make(gen):
        return unstall.DataLoader(
            IdDataset(n),
            batch_size=bs,
            shuffle=True,
            num_workers=num_workers,
            persistent_workers=persistent,
            generator=gen,
        )

    torch.manual_seed(0)
    gen = None if gen_seed is None else torch.Generator().manual_seed(gen_seed)
    first, got = make(gen), []
    it = iter(first)
    while len(got) < cut:
        batch = next(it, None)
        if batch is None:
            it = iter(first)
            continue
        got.append(batch.tolist())
    state, rng = first.state_dict(), torch.get_rng_state()
    gen_state = None if gen is None else gen.get_state()
    del it, first
    torch.manual_seed(99)  # the checkpoint restores what matters
    gen2 = None if gen_state is None else torch.Generator()
    if gen2 is not None:
        gen2.set_state(gen_state)
    second = make(gen2)
    second.load_state_dict(state)
    torch.set_rng_state(rng)
    per_epoch = len(second)
    while len(got) < epochs * per_epoch:
        got.extend(b.tolist() for b in second)
    return got, torch.rand(1).item(), None if gen2 is None else gen2.get_state()


@pytest.mark.parametrize(
    ("num_workers", "persistent"), [(0, False), (2, False), (2, True)], ids=["w0", "w2", "w2p"]
)
@pytest.mark.parametrize("gen_seed", [None, 7], ids=["global", "generator"])
def test_resume_continues_torchs_samples_and_random_numbers(num_workers, persistent, gen_seed):
    kw = dict(n=11, bs=3, shuffle=True, num_workers=num_workers, persistent_workers=persistent)
    reference = _run(TorchDataLoader, gen_seed=gen_seed, **kw)
    for cut in (0, 1, 2, 4, 6):  # 4 batches an epoch: start, inside, end, into the next
        _same(_resume_run(num_workers, gen_seed, persistent, cut), reference)


def test_image_pipeline_still_follows_the_batch_under_torchs_order(tmp_path):
    """unstall's own pipeline keeps its per-batch stream (keyed by torch's draw), any workers."""
    from tests.conftest import write_jpegs
    from unstall.pipeline import ImagePipeline
    from unstall.stores import LocalStore

    root = write_jpegs(tmp_path, 12, classes=2, seed=3)
    ds = unstall.ImageFolder(LocalStore(root), transform=ImagePipeline(size=32, seed=1))

    def run(num_workers):
        torch.manual_seed(3)
        loader = unstall.DataLoader(ds, batch_size=4, shuffle=True, num_workers=num_workers)
        return [(x.clone(), y.clone()) for x, y in loader], torch.rand(1).item()

    (a, next_a), (b, next_b) = run(0), run(2)
    assert next_a == next_b
    for (xa, ya), (xb, yb) in zip(a, b, strict=True):
        assert torch.equal(ya, yb) and torch.equal(xa, xb)
