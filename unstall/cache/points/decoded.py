"""The decoded point (``Cache(size, hold="decoded")``): a recognized torchvision image
folder's images after the deterministic start of its transform, stored as uint8 pixels.

A dataset is recognized when it is a torchvision ``DatasetFolder`` (``ImageFolder``) with
torchvision's own ``__getitem__`` and a transform that is a ``Compose`` (v1 or v2) or
None. Its preparation ``transform(loader(path))`` is split at the first step that is not
a known deterministic op (`unstall.cache.points.determinism.is_random_step`), and at the
first step that leaves PIL images (``ToTensor``, ``PILToTensor``...: the pixels stay
uint8): the prefix (decode, ``Resize``, ``CenterCrop``...) is cached, the rest
(``RandomResizedCrop``, flips, ``ToTensor``, ``Normalize``) runs on every access, with
the draws it makes now (per seed, epoch and batch, as without the cache: the prefix
draws nothing). Validation's ``Resize(256) + CenterCrop(224)`` caches 224x224 images;
training's ``RandomResizedCrop`` first caches the decoded image.

A loader function other than torchvision's is checked like an opaque ``__getitem__``
(`unstall.cache.points.determinism.check_samples`) on the job's own files. Entries are
keyed as the sample cache's (`unstall.cache.points.samples`): the file's version and the
fingerprint of the loader function and the prefix alone, so a training job and its
evaluation job with the same prefix share them.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch.utils.data

from unstall.cache.points import codec
from unstall.cache.points.determinism import Verdict, check_samples, is_random_step, op_name
from unstall.cache.points.samples import Refused, SampleCache, refusal

#: Steps that leave PIL images: the prefix stops before them (its output stays uint8).
_TO_TENSOR = ("ToTensor", "PILToTensor", "ToImage", "ToImageTensor", "ToPureTensor")


@dataclass(frozen=True)
class Split:
    """A recognized folder's preparation, split where caching stops."""

    paths: list[str]
    loader: Callable[[str], Any]
    prefix: tuple[Any, ...]
    rest: tuple[Any, ...]
    target_transform: Callable[[Any], Any] | None
    default_loader: bool

    def head(self, path: str) -> Any:
        """The cached part: the image decoded and put through the prefix."""
        image = self.loader(path)
        for step in self.prefix:
            image = step(image)
        return image

    def tail(self, image: Any) -> Any:
        for step in self.rest:
            image = step(image)
        return image

    def describe(self) -> str:
        return " + ".join(["decode", *(op_name(s) for s in self.prefix)])


class PrefixOf:
    """What the decoded entries' fingerprint is taken of: the loader and the prefix alone."""

    def __init__(self, split: Split):
        self.loader, self.prefix = split.loader, list(split.prefix)


def split_folder(dataset: Any) -> Split:
    """``dataset``'s preparation split (module notes).

    Raises:
        Refused: not a recognized folder, or its transform is not a Compose.
    """
    folder = sys.modules.get("torchvision.datasets.folder")
    name = type(dataset).__name__
    if folder is None or not isinstance(dataset, folder.DatasetFolder):
        raise Refused(refusal("recognized", f"{name} is not a torchvision image folder"))
    if type(dataset).__getitem__ is not folder.DatasetFolder.__getitem__:
        raise Refused(refusal("recognized", f"{name} has its own __getitem__"))
    transform = dataset.transform
    steps: list[Any] = []
    if transform is not None:
        inner = getattr(transform, "transforms", None)
        if not isinstance(inner, (list, tuple)) or op_name(transform) != "Compose":
            why = f"{name}.transform is {op_name(transform)}, not a Compose"
            raise Refused(refusal("recognized", why))
        steps = list(inner)
    cut = 0
    while cut < len(steps) and is_random_step(steps[cut]) is False:
        if op_name(steps[cut]) in _TO_TENSOR:
            break
        cut += 1
    loader = dataset.loader
    return Split(
        paths=[str(p) for p, _ in dataset.samples],
        loader=loader,
        prefix=tuple(steps[:cut]),
        rest=tuple(steps[cut:]),
        target_transform=dataset.target_transform,
        default_loader=loader in (folder.default_loader, folder.pil_loader),
    )


def loader_verdict(split: Split, declared: bool | None, picks: Sequence[int]) -> Verdict:
    """The loader function's determinism: torchvision's is known; another is checked."""
    if declared is not None or split.default_loader:
        how = "declared" if declared else "checked"
        if declared is False:
            return Verdict(False, "refused", "opted out", "deterministic=False")
        return Verdict(True, how)
    return check_samples(lambda i: codec.encode(split.head(split.paths[i])), picks)


class DecodedCache(SampleCache):
    """A bound decoded cache: `serve` gives the folder with its prefix served from it."""

    def __init__(self, layer: Any, split: Split, *, only: Any = None, **args: Any):
        super().__init__(layer, split.paths, **args)
        self.split = split
        #: Which samples are decoded here (a bool per sample; None: all): ``hold="auto"``.
        self.only = only
        #: The byte cache of the other samples' files (``hold="auto"``), served by the open
        #: hook in the workers (`unstall.loader.file_hook`).
        self.files: Any = None
        #: The placement planned (``hold="auto"``: `unstall.cache.points.planning.Plan`).
        self.plan: Any = None
        #: The tier each decoded entry goes to, a byte per sample (its position in the
        #: segment's tiers: 0 RAM, 1 disk); None: the first that takes it.
        self.tier_of: bytes | None = None

    def put(self, index: int, data: bytes, version: Any, asked: int) -> list:
        """``data`` to the tier planned for it (another tier never takes it)."""
        if self.tier_of is None:
            return super().put(index, data, version, asked)
        out = [(0, 0)] * asked
        at = self.tier_of[index]
        if at < asked:
            out[at] = self.layer.tiers[at].put_many([(index, data)], version, self.layer.bound_ns)
        return out

    def serve(self, dataset: Any) -> DecodedFolder:
        return DecodedFolder(dataset, self)

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        cache = out["cache"]
        cache.update(prefix=self.split.describe(), rest=[op_name(s) for s in self.split.rest])
        if self.plan is not None:
            cache.update(
                holds="auto",
                decoded_samples=int(self.plan.decoded.sum()),
                bytes_samples=int(self.plan.as_bytes.sum()),
                decoded_on_disk=int((self.plan.decoded & self.plan.on_disk).sum()),
                bytes_on_disk=int((self.plan.as_bytes & self.plan.on_disk).sum()),
                planned_saved_s=round(self.plan.saved_s, 4),
                bytes_only_saved_s=round(self.plan.bytes_only_saved_s, 4),
                ram_only_saved_s=round(self.plan.ram_only_saved_s, 4),
                costs=self.plan.costs,
            )
        if self.files is not None:
            files = self.files.stats()["cache"]
            keys = ("name", "hits", "misses", "inserted_bytes", "files", "ram_hits", "disk_hits")
            cache["bytes"] = {k: files[k] for k in keys if k in files}
        return out

    def close(self) -> bool:
        closed = super().close()
        if self.files is not None:
            self.files.close()
        return closed


class DecodedFolder(torch.utils.data.Dataset):
    """torchvision's ``DatasetFolder.__getitem__`` with the prefix's output from the cache."""

    def __init__(self, dataset: Any, cache: DecodedCache):
        self.dataset, self.cache = dataset, cache
        self.samples = dataset.samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, target = self.samples[index]
        split, only = self.cache.split, self.cache.only
        if only is None or only[index]:
            image = self.cache.get(index, lambda i: split.head(path))
        else:
            image = split.head(path)  # its file's bytes from the byte cache, if planned
        sample = split.tail(image)
        if split.target_transform is not None:
            target = split.target_transform(target)
        return sample, target
