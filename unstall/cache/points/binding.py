"""`bind_points`: a cache whose ``hold`` is not bytes, bound to a loader's dataset.

``hold="samples"`` binds the whole-sample cache (`unstall.cache.points.samples`).
``hold="decoded"`` and ``"auto"`` bind the decoded point of a recognized torchvision image
folder (`unstall.cache.points.placement`); another dataset gets the whole-sample cache
if its preparation is deterministic (one of unstall's own keyed datasets too, versioned
by its store). A dataset none can take (no file per sample, a store with no item versions,
or a preparation not shown deterministic) gets the byte cache instead, as ``hold="bytes"``
would bind it, with one line naming the check that failed; its
``loader.stats()["cache"]`` carries the same.
"""

from __future__ import annotations

from typing import Any

from unstall.cache.files import bind_files, say
from unstall.cache.points.decoded import split_folder
from unstall.cache.points.placement import bind_decoded
from unstall.cache.points.samples import Refused, bind_samples
from unstall.stores.base import is_keyed


def bind_points(cache: Any, dataset: Any) -> Any:
    """The loader's layer for ``cache`` (``hold`` not bytes) on ``dataset`` (module notes)."""
    name = type(dataset).__name__
    hold = getattr(cache, "hold", "samples")
    try:
        if hold in ("decoded", "auto"):
            try:
                split = split_folder(dataset)
            except Refused:
                split = None  # not a recognized folder: its whole samples, if deterministic
            if split is not None:
                return bind_decoded(cache, dataset, split, hold)
        return bind_samples(cache, dataset, "samples")
    except Refused as exc:
        refusal = exc.stats
    say(
        f"unstall: {name}'s samples are not cached (hold={hold!r}): the "
        f"{refusal['failed_check']!r} check failed: {refusal['reason']}; caching its bytes"
    )
    notes = {**refusal, "asked": hold}
    if is_keyed(dataset):
        return _Noted(cache.bind(dataset), notes)
    files = bind_files(cache, dataset)
    if files is not None:
        files.notes.update(notes)
    return files


class _Noted:
    """A byte cache layer whose stats carry why the samples were not cached."""

    def __init__(self, layer: Any, notes: dict[str, Any]):
        self.layer, self.notes = layer, notes

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["layer"], name)

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def stats(self) -> dict[str, Any]:
        out = self.layer.stats()
        out["cache"].update(self.notes)
        return out
