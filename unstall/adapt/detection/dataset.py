"""`PlannedDetection`: the script's dataset, its detection pipeline run as a plan.

The way in: ``dataset[i]`` is the script's own ``__getitem__`` (its file reading, its
target parsing, its Subsets), called with the pipeline attribute (``transforms`` or
``transform``) of the dataset that holds it swapped, for the call only, for the
`DetectionPlan` (same call, ``(image, target) -> (image, target)``), then put back. Nothing
of the script's dataset changes outside the call, and whatever ``__getitem__`` does after
its pipeline (extra fields, its own return shape) stays as it is.

Draws: inside an unstall loader's batch, from a stream seeded by (the batch's seed, the
sample's index), so an epoch's augmentations depend only on the loader's seed, epoch and
order (exact resume, any ``num_workers``), on a forked copy of torch's generator (the
worker's own stream is untouched); outside one, from torch's generator as the script's
pipeline would.

Decode: where ``__getitem__`` decodes JPEG bytes with ``torchvision.io`` (``decode_jpeg``,
``decode_image``, ``read_image``), `unstall.adapt.detection.decode` defers the decode to
the plan, which decodes at a reduced DCT scale when its output allows it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.utils.data

from unstall.adapt.detection.decode import Deferred, intercept
from unstall.adapt.detection.plan import DetectionPlan
from unstall.pipeline import batch_seed


class PlannedDetection(torch.utils.data.Dataset):
    """``dataset`` with ``owner.<attr>`` run as ``plan`` (see the module's docstring)."""

    def __init__(self, dataset: Any, owner: Any, attr: str, plan: DetectionPlan, name: str):
        self.dataset = dataset
        self.owner = owner
        self.attr = attr
        self.plan = plan
        self.name = name
        self.defer = True  # off for good once a script changed a deferred image before use

    def __len__(self) -> int:
        return len(self.dataset)

    def __repr__(self) -> str:
        return f"PlannedDetection({self.name}, {self.plan!r})"

    def __getitem__(self, index: int) -> Any:
        seed = batch_seed.current()[0]
        if seed is None:
            return self._get(index)
        state = np.random.SeedSequence([seed, int(index), 0xDE7EC7]).generate_state(2, np.uint32)
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed((int(state[0]) << 31) ^ int(state[1]))
            return self._get(index)

    def _get(self, index: int) -> Any:
        kept = self.owner.__dict__.get(self.attr, _MISSING)
        setattr(self.owner, self.attr, self.plan)
        try:
            if not self.defer:
                return self.dataset[index]
            deferred = Deferred()
            self.plan.deferred = deferred
            with intercept(type(self.owner), deferred):
                try:
                    return self.dataset[index]
                except deferred.Changed:
                    self.defer = False  # the script reworks its decoded image: decode it whole
            self.plan.deferred = None
            return self.dataset[index]
        finally:
            self.plan.deferred = None
            if kept is _MISSING:
                delattr(self.owner, self.attr)
            else:
                setattr(self.owner, self.attr, kept)


_MISSING = object()
