"""Is a dataset's preparation deterministic? Known for recognized ops, checked for the rest.

A sample (or the output of a transform's prefix) may be cached only if preparing it
again would give the same thing. Two ways to know:

- **Recognized ops** (`transform_steps`, `random_step`): torchvision's transform classes
  say what they are: ``Random*``, ``ColorJitter``, ``AutoAugment``... draw; ``Resize``,
  ``CenterCrop``, ``ToTensor``, ``Normalize``... do not. A dataset whose transform holds
  a random op is refused without running anything, naming the op.
- **Checked on the job's own samples** (`check_samples`): each of a few indices spread over
  the dataset is prepared twice, under two different seeds of torch's, numpy's and
  Python's global generators. The two outputs must be identical (bit for bit, as the
  cache would store them), and no generator's state may move: a draw whose result
  happens not to change the output still counts as a draw (it would the next time).
  A library's own generator (an augmentation library's numpy ``Generator``, a
  ``random.Random`` of its own) is not seeded by either run, so its draws show as
  different outputs. The generators' states are restored afterwards.

``Cache(deterministic=True)`` skips the check (the user knows better); ``False`` never
caches prepared samples. `Verdict` carries which check failed, for the one line the loader
prints and for ``loader.stats()``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Seeds of the two runs of the check.
SEEDS = (20_011, 7_919_003)
#: Indices the check prepares (spread over the dataset).
CHECKED = 3
#: torchvision transforms that draw, beyond the ``Random*`` ones.
RANDOM_OPS = frozenset(
    {
        "ColorJitter",
        "AutoAugment",
        "RandAugment",
        "TrivialAugmentWide",
        "AugMix",
        "ElasticTransform",
        "GaussianBlur",
        "GaussianNoise",
        "MixUp",
        "CutMix",
        "ScaleJitter",
        "RandomShortestSize",
        "JPEG",
    }
)
#: torchvision transforms that are known not to draw.
DETERMINISTIC_OPS = frozenset(
    {
        "Resize",
        "CenterCrop",
        "ToTensor",
        "PILToTensor",
        "ToPILImage",
        "ToImage",
        "ToPureTensor",
        "ToDtype",
        "ConvertImageDtype",
        "Normalize",
        "Grayscale",
        "Pad",
        "FiveCrop",
        "TenCrop",
        "Identity",
        "ClampBoundingBoxes",
        "SanitizeBoundingBoxes",
    }
)
#: Attributes that hold a dataset's transforms (torchvision's names).
_TRANSFORM_ATTRS = ("transform", "transforms", "target_transform")


@dataclass(frozen=True)
class Verdict:
    """Whether prepared samples may be cached, and how that was decided.

    Attributes:
        ok: they may.
        how: ``"checked"`` (on the job's samples), ``"declared"`` (``deterministic=True``),
            ``"refused"`` (a check failed, or ``deterministic=False``).
        check: the check that failed (``"random op"``, ``"same output"``, ``"generator
            untouched"``, ``"error"``, ``"opted out"``); empty when ``ok``.
        reason: one line saying why (names the op, index or generator).
    """

    ok: bool
    how: str
    check: str = ""
    reason: str = ""

    def as_stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"deterministic": self.ok, "determinism": self.how}
        if not self.ok:
            out.update(failed_check=self.check, reason=self.reason)
        return out


def op_name(step: Any) -> str:
    return type(step).__name__


def transform_steps(transform: Any) -> list[Any]:
    """The steps of a ``Compose`` (v1 or v2, nested ones flattened); ``[transform]`` otherwise."""
    inner = getattr(transform, "transforms", None)
    if isinstance(inner, (list, tuple)) and _is_torchvision(transform):
        return [s for step in inner for s in transform_steps(step)]
    return [transform]


def is_random_step(step: Any) -> bool | None:
    """True if ``step`` is a torchvision op that draws, False if one that does not, None if
    not a torchvision op (unknown: the check decides)."""
    if not _is_torchvision(step):
        return None
    name = op_name(step)
    if name.startswith("Random") or name in RANDOM_OPS:
        return True
    return False if name in DETERMINISTIC_OPS else None


def random_step(dataset: Any) -> str | None:
    """The name of the first recognized random op in ``dataset``'s transforms (Subsets
    followed), or None."""
    for _ in range(4):
        for attr in _TRANSFORM_ATTRS:
            transform = getattr(dataset, attr, None)
            if transform is None or not callable(transform):
                continue
            for step in transform_steps(transform):
                if is_random_step(step):
                    return f"{attr} has {op_name(step)}, a random op"
        inner = getattr(dataset, "dataset", None)
        if inner is None:
            return None
        dataset = inner
    return None


def verdict_for(
    dataset: Any,
    get: Callable[[int], bytes],
    declared: bool | None,
) -> Verdict:
    """Whether ``dataset``'s prepared samples may be cached: ``declared`` (the cache's
    ``deterministic=``) if given, else its recognized ops, then the check on its samples
    (``get(i)``: sample ``i`` prepared and encoded)."""
    if declared is False:
        return Verdict(False, "refused", "opted out", "deterministic=False")
    if declared is True:
        return Verdict(True, "declared")
    why = random_step(dataset)
    if why is not None:
        return Verdict(False, "refused", "random op", why)
    n = len(dataset)
    picks = sorted({0, n // 2, n - 1})[:CHECKED] if n else []
    return check_samples(get, picks)


def check_samples(get: Callable[[int], bytes], indices: Sequence[int]) -> Verdict:
    """Prepare each index under the two seeds (module notes); the generators' states are as
    they were afterwards."""
    saved = _states()
    try:
        for i in indices:
            outputs = []
            for seed in SEEDS:
                _seed_all(seed)
                before = _states()
                try:
                    outputs.append(get(i))
                except Exception as exc:  # the loader will meet it too, and name the sample
                    why = f"dataset[{i}] raised {type(exc).__name__}: {exc}"
                    return Verdict(False, "refused", "error", why)
                moved = _moved(before, _states())
                if moved:
                    why = f"dataset[{i}] draws from {moved}'s global generator"
                    return Verdict(False, "refused", "generator untouched", why)
            if outputs[0] != outputs[1]:
                why = f"dataset[{i}] differs between two preparations (a random draw)"
                return Verdict(False, "refused", "same output", why)
    finally:
        _restore(saved)
    return Verdict(True, "checked")


def _seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _states() -> tuple[Any, Any, Any]:
    import torch

    return random.getstate(), np.random.get_state(), torch.get_rng_state()


def _moved(a: tuple[Any, Any, Any], b: tuple[Any, Any, Any]) -> str:
    """The generators whose state differs between ``a`` and ``b`` ("" if none)."""
    import torch

    moved = []
    if a[0] != b[0]:
        moved.append("random")
    na, nb = a[1], b[1]
    if not (np.array_equal(na[1], nb[1]) and na[2:] == nb[2:]):
        moved.append("numpy")
    if not torch.equal(a[2], b[2]):
        moved.append("torch")
    return " and ".join(moved)


def _restore(states: tuple[Any, Any, Any]) -> None:
    import torch

    random.setstate(states[0])
    np.random.set_state(states[1])
    torch.set_rng_state(states[2])


def _is_torchvision(obj: Any) -> bool:
    return type(obj).__module__.startswith("torchvision.transforms")
