"""Datasets over a `Store`: fetch (bytes from storage) kept apart from prepare (decode, augment)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch.utils.data

from unstall.data.keys import KeyTable
from unstall.errors import EmptyDatasetError, SampleError
from unstall.stores import LocalStore, Store, open_store

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp")


class FileDataset(torch.utils.data.Dataset):
    """Samples stored as one object (file) per key, with an optional label each.

    Loading a sample is two steps that unstall times, caches and schedules apart:
    ``fetch(indices)`` returns raw bytes from the store (many keys at once, so
    object stores keep requests in flight), ``prepare(index, raw)`` decodes and
    augments. ``__getitem__``/``__getitems__`` do both, so the dataset also works
    with `torch.utils.data.DataLoader`.

    Args:
        source: a path, a URL (``s3://bucket/prefix``) or a `Store`.
        keys: the keys of the samples, in dataset order.
        labels: one integer label per key, or None.
        transform: turns raw bytes into a sample (e.g. `unstall.ImagePipeline`);
            None yields the raw bytes.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Store,
        keys: Sequence[str],
        *,
        labels: Sequence[int] | np.ndarray | None = None,
        transform: Callable[[bytes], Any] | None = None,
    ):
        self.store = open_store(source)
        self.keys = keys if isinstance(keys, KeyTable) else KeyTable(keys)
        if len(self.keys) == 0:
            raise EmptyDatasetError(f"dataset over {self.store.url!r} has no keys")
        if labels is not None:
            labels = np.asarray(labels, dtype=np.int64)
            if labels.shape != (len(self.keys),):
                raise ValueError(
                    f"labels has shape {labels.shape}, expected ({len(self.keys)},): "
                    "one label per key"
                )
        self.labels = labels
        self.transform = transform
        self._versions: np.ndarray | None = None
        self._versioned = False

    def __len__(self) -> int:
        return len(self.keys)

    def key(self, index: int) -> str:
        """The store key of sample ``index``."""
        return self.keys[index]

    def fingerprint(self) -> str:
        """Identifies the data (store location + keys), not the transform: names shared caches."""
        digest = hashlib.blake2b(self.store.url.encode(), digest_size=16)
        digest.update(self.keys.fingerprint().encode())
        return digest.hexdigest()

    def versions(self) -> np.ndarray | None:
        """The version of each sample's object (int64; `Store.versions`), taken once, on the
        first call (`Cache.bind` makes it): caches serve a sample only under this version.
        None if the store cannot say."""
        if not getattr(self, "_versioned", False):
            self._versions = self.store.versions(self.keys)
            self._versioned = True
        return self._versions

    def fetch(self, indices: Sequence[int]) -> list[bytes]:
        """Raw bytes of each sample, from storage, in order."""
        return self.store.get_many([self.keys[i] for i in indices])

    def prefetch(self, indices: Sequence[int]) -> None:
        """Hint that these samples come soon: the store may start fetching them now."""
        self.store.prefetch([self.keys[i] for i in indices])

    def prepare(self, index: int, raw: bytes) -> Any:
        """Turn one sample's raw bytes into what training sees: ``(x, label)`` or ``x``."""
        try:
            x = self.transform(raw) if self.transform is not None else raw
        except Exception as exc:
            raise self.sample_error(index, exc) from exc
        if self.labels is None:
            return x
        return x, int(self.labels[index])

    def sample_error(self, index: int, exc: Exception, step: str = "") -> SampleError:
        """The error for sample ``index`` whose preparation (``step``, e.g. "target_transform")
        raised ``exc``: it names the sample, its key and the cause."""
        where = f"{step} failed: " if step else ""
        return SampleError(
            f"cannot prepare sample {index} (key {self.keys[index]!r}): {where}"
            f"{type(exc).__name__}: {exc}",
            index=index,
            key=self.keys[index],
        )

    def __getitem__(self, index: int) -> Any:
        return self.prepare(index, self.fetch([index])[0])

    def __getitems__(self, indices: Sequence[int]) -> list[Any]:
        raws = self.fetch(indices)
        return [self.prepare(i, raw) for i, raw in zip(indices, raws, strict=True)]


class ImageFolder(FileDataset):
    """Images in class sub-folders (``root/<class>/<file>.jpg``), like torchvision's.

    Labels are class indices in sorted class-name order. The default transform is
    the standard training pipeline (`unstall.ImagePipeline`: decode,
    RandomResizedCrop(224), flip, normalize).

    Args:
        source: a path, URL or `Store` holding the class folders.
        transform: bytes -> sample; default `ImagePipeline()`; pass ``None`` explicitly
            via ``raw=True`` to get bytes.
        raw: yield raw bytes instead of decoded images.
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | Store,
        *,
        transform: Callable[[bytes], Any] | None = None,
        raw: bool = False,
    ):
        store = open_store(source)
        keys, labels, self.classes = _image_index(store)
        if not len(keys):
            raise EmptyDatasetError(
                f"no images found in {store.url!r}: expected <class>/<image> files with "
                f"extensions {', '.join(IMAGE_EXTENSIONS)}"
            )
        if transform is None and not raw:
            from unstall.pipeline import ImagePipeline

            transform = ImagePipeline()
        super().__init__(store, keys, labels=labels, transform=None if raw else transform)


def _image_index(store: Store) -> tuple[KeyTable | list[str], np.ndarray, list[str]]:
    """``(keys, labels, classes)`` of ``<class>/<image>`` keys: a local folder's from its saved
    index (`unstall.data.folder_index`), other stores' from their (cached) listing."""
    if isinstance(store, LocalStore):
        from unstall.data.folder_index import folder_index

        return folder_index(store.root, IMAGE_EXTENSIONS)
    lister = getattr(store, "list_cached", None)
    listed = lister() if lister is not None else store.list()
    keys = [k for k in listed if k.lower().endswith(IMAGE_EXTENSIONS) and "/" in k]
    classes = sorted({k.split("/", 1)[0] for k in keys})
    class_index = {name: i for i, name in enumerate(classes)}
    labels = np.fromiter((class_index[k.split("/", 1)[0]] for k in keys), dtype=np.int64)
    return keys, labels, classes
