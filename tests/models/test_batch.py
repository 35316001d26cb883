"""How many samples a collated batch holds (`batch_size_of`): torch's default_collate, plain
lists, and the list collates of detection scripts (images of their own sizes, target dicts),
which the loader's stats and ``unstall analyze`` count samples by."""

from __future__ import annotations

import torch
from torch.utils.data import default_collate
from torchvision import tv_tensors

from unstall.models.batch import batch_size_of


def _detection_samples(n: int) -> list[tuple]:
    return [
        (tv_tensors.Image(torch.zeros(3, 20 + k, 30)), {"boxes": torch.zeros(k + 1, 4), "id": k})
        for k in range(n)
    ]


def test_a_list_collated_detection_batch_counts_its_samples() -> None:
    samples = _detection_samples(16)
    assert batch_size_of(tuple(zip(*samples, strict=True))) == 16  # torchvision's reference
    assert batch_size_of(list(samples)) == 16  # collate_fn=lambda b: b
    assert batch_size_of(tuple(zip(*samples[:1], strict=True))) == 1
    assert batch_size_of(samples[:1]) == 1
    assert batch_size_of(tuple(zip(*samples[:3], strict=True))) == 3  # not the 3 channels


def test_default_collated_and_plain_batches_as_before() -> None:
    images = [(torch.zeros(3, 8, 8), k) for k in range(5)]
    assert batch_size_of(default_collate(images)) == 5
    fields = [{"image": torch.zeros(3, 4, 4), "boxes": [torch.zeros(4)] * 2} for _ in range(6)]
    assert batch_size_of(default_collate(fields)) == 6
    assert batch_size_of([[torch.zeros(7, 2), torch.zeros(7)], [torch.zeros(7)]]) == 7
    assert batch_size_of([b"a", b"b", b"c"]) == 3 and batch_size_of(torch.zeros(4, 2)) == 4
