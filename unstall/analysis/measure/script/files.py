"""The file-level node cache, as the agent sees it in the script's process (issue 40).

A script's own Dataset that opens files by path (torchvision's ``samples``, a list of
paths) can take the node cache under ``unstall run --config`` (`unstall.cache.files`).
Two facts are taken here, in the job's process, for the later stages:

- `file_cache_facts`: whether the file cache applies to the measured loader's dataset,
  the files it lists and their bytes (the rates stage prices a cache of a fraction of
  them), or why it does not apply (said in the report, never an error);
- `evict_listed`: the cold run's files dropped from the page cache (as the analyzer drops
  unstall's datasets' files), so a dataset read from local disk is measured as it reads
  from storage, not from what an earlier run left in memory;
- `prefill`: in the verification's run under a cache setting, the cache filled before
  timing as the first epoch leaves it (a random share of the listed files, as many as fit),
  so the measured window is the steady state the model priced (a hit rate of C/N), not the
  first epoch's fill. The files it read are dropped from the page cache again. A sample
  cache (``hold="samples"``) is filled with every prepared sample
  (`unstall.analysis.measure.script.samples.prefill_samples`).
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from unstall import machine
from unstall.stores.base import is_keyed

#: Files whose sizes are read to estimate the listed bytes (evenly spaced).
SIZE_SAMPLE = 256
#: Files filled per round of `prefill`: it stops at the first round that stores none.
FILL_ROUND = 64
#: Seconds `prefill` and `evict_listed` may take at most (a huge dataset: a share of it).
FILL_MAX_S = 60.0
EVICT_MAX_S = 15.0


def evict_listed(dataset: Any) -> bool:
    """Drop the files ``dataset`` lists from the page cache (at most `EVICT_MAX_S`); False
    when it lists none (or is one of unstall's: evicted by its store)."""
    from unstall.cache.files import drop_page_cache, listed_paths

    if dataset is None or callable(getattr(dataset, "fingerprint", None)):
        return False
    try:
        paths, _ = listed_paths(dataset)
    except Exception:  # lists no files: nothing to evict
        return False
    end = time.monotonic() + EVICT_MAX_S
    for start in range(0, len(paths), 1024):
        drop_page_cache(paths[start : start + 1024])
        if time.monotonic() > end:
            break
    return True


def file_cache_facts(dataset: Any) -> dict[str, Any]:
    """Whether the file cache applies to ``dataset``: ``{"applies": True, "files", "bytes",
    "where"}`` or ``{"applies": False, "why"}``; ``{"applies": None}`` for unstall's own
    datasets (their own cache applies, priced as before)."""
    from unstall.cache.files import NoListing, listed_paths

    name = type(dataset).__name__
    if dataset is None:
        return {"applies": False, "why": "the loader has no dataset"}
    if is_keyed(dataset):
        return {"applies": None, "why": f"{name} is one of unstall's datasets (its own cache)"}
    try:
        paths, where = listed_paths(dataset)
    except NoListing as exc:
        return {"applies": False, "why": f"{exc}: its reads cannot be told apart to cache"}
    except Exception as exc:  # a dataset's odd attribute must not end the measurement
        return {"applies": False, "why": f"its files could not be listed ({type(exc).__name__})"}
    step = max(1, len(paths) // SIZE_SAMPLE)
    sizes = []
    for p in paths[::step][:SIZE_SAMPLE]:
        try:
            sizes.append(os.path.getsize(p))
        except OSError:
            continue
    if not sizes:
        return {"applies": False, "why": f"the files {name}.{where} lists cannot be read"}
    total = int(sum(sizes) / len(sizes) * len(paths))
    return {"applies": True, "files": len(paths), "bytes": total, "where": f"{name}.{where}"}


def prefill(loader: Any) -> dict[str, Any] | None:
    """Under ``unstall run --config`` with a cache for a dataset that opens its files: fill the
    node cache now, as an epoch leaves it (module notes); None when nothing applies."""
    config = machine.config_path()
    dataset = getattr(loader, "dataset", None)
    if not config or dataset is None:
        return None
    from unstall.cache.files import drop_page_cache
    from unstall.loader.cache_binding import resolve_cache
    from unstall.loader.config_file import load_overrides

    try:
        setting = load_overrides(config).get("cache")
    except ValueError:
        return None
    binding = resolve_cache(setting, dataset) if setting is not None else None
    if binding is not None and binding.points:  # the whole-sample cache: its own fill
        from unstall.analysis.measure.script.samples import prefill_samples

        return prefill_samples(binding, dataset, getattr(loader, "num_workers", 1))
    if binding is None or not binding.files:
        return None
    files = binding.bind(dataset)  # the same node segment the loader bound
    if files is None:
        return None
    order = list(range(files.files))
    random.Random(0).shuffle(order)
    stored, complete = 0, True
    end = time.monotonic() + FILL_MAX_S
    try:
        for start in range(0, len(order), FILL_ROUND):
            chunk = order[start : start + FILL_ROUND]
            got = files.fill(chunk)
            drop_page_cache([files.paths[i] for i in chunk])
            stored += got
            if not got:  # full (or held already): the rest would not be stored
                break
            if time.monotonic() > end:
                complete = False  # a share of what the epoch leaves: said in the report
                break
    finally:
        files.close()
    return {"stored": stored, "files": files.files, "complete": complete}


def evict_first(loader: Any, batches: int) -> bool:
    """Drop the files the first ``batches`` batches read from the page cache, if it can tell."""
    from unstall.analysis.measure.storage import evict

    order = getattr(loader, "order", None)
    if order is None:
        return False
    indices: list[int] = []
    try:
        for b, batch in enumerate(order.batches(getattr(loader, "epoch", 0))):
            if b >= batches:
                break
            indices.extend(batch)
    except ValueError:  # torch's order: known only once the epoch has drawn it
        return False
    return evict(loader.dataset, indices)
