"""Small tensors travel inline from workers; large ones take torch's shared-memory path."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

import unstall
from unstall.loader.handoff import INLINE_MAX_BYTES, Inline, pack, unpack


class Mixed(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int):
        big = torch.full((64, 64, 3), i, dtype=torch.uint8)  # 12 KB each: a batch > 64 KB
        return {"big": big, "label": i, "half": torch.tensor([i / 2], dtype=torch.float16)}


def test_pack_roundtrip_keeps_values_dtypes_and_structure():
    batch = (
        torch.arange(10),
        [torch.ones(3, dtype=torch.bool), {"x": torch.zeros(2, 2, dtype=torch.float64)}],
        torch.zeros(INLINE_MAX_BYTES + 1, dtype=torch.uint8),
        "text",
    )
    packed = pack(batch)
    assert isinstance(packed[0], Inline) and isinstance(packed[1][1]["x"], Inline)
    assert isinstance(packed[2], torch.Tensor)  # too big: stays a tensor
    back = unpack(pickle.loads(pickle.dumps(packed)))
    assert torch.equal(back[0], batch[0]) and back[0].dtype == torch.int64
    assert torch.equal(back[1][0], batch[1][0]) and back[1][0].dtype == torch.bool
    assert torch.equal(back[1][1]["x"], batch[1][1]["x"])
    assert back[3] == "text"
    assert isinstance(unpack(Inline(np.arange(3))), torch.Tensor)


@pytest.mark.parametrize("pin_memory", [False, True])
def test_batches_through_workers_equal_torchs(pin_memory):
    ours = list(unstall.DataLoader(Mixed(), batch_size=5, num_workers=2, pin_memory=pin_memory))
    ref = list(torch.utils.data.DataLoader(Mixed(), batch_size=5, num_workers=2))
    assert len(ours) == len(ref) == 3
    for a, b in zip(ours, ref, strict=True):
        assert set(a) == set(b)
        for k in a:
            assert torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype
