"""Changing a running epoch's worker pool between two batches, losing and repeating nothing.

The change is the resume mechanism applied in place: the running torch iterator is
ended after the last batch the loop took (with a device stage: the last one pulled,
the stage's batch ahead is kept), and a new one, with the new worker count and
prefetch, starts at exactly the next batch of the same epoch. Tasks the old workers
had prefetched but not handed over are dropped and made again by the new pool; with
``seed=`` a batch's random draws follow ``(seed, epoch, batch)``, so they come out the
same. The old pool's zero-copy slots are retired (unlinked: batches the loop still
holds stay readable) and a pool sized for the new prefetch depth is opened.
"""

from __future__ import annotations

from typing import Any

from unstall.loader.worker_death import owning_workers, start_workers


def pulled(it: Any) -> int:
    """Batches of ``it``'s epoch taken from its torch iterator (handed out, or held ahead)."""
    ahead = it.__dict__.get("_ahead") is not None
    return it._cursor.handed + (1 if ahead else 0)


def can_restart(it: Any) -> bool:
    """Whether ``it`` has batches left to make (no change is worth it otherwise)."""
    if it.__dict__.get("_done") or it.__dict__.get("_pulled_all"):
        return False
    return pulled(it) < (it._length or 0)


def restart_pool(loader: Any, it: Any, raw: Any, workers: int, prefetch: int) -> Any:
    """End ``raw`` (``it``'s torch iterator) and continue ``it``'s epoch on a new pool of
    ``workers`` x ``prefetch``; returns the new torch iterator (its workers started)."""
    stopper = getattr(raw, "_unstall_stopper", None)
    if stopper is not None:
        stopper.detach()
        raw._unstall_stopper = None
    raw._shutdown_workers()  # torch forgets its pids first: their exits raise nothing
    inner = loader._inner
    if getattr(inner, "_iterator", None) is raw:
        inner._iterator = None  # persistent workers: the next iter() keeps the new pool
    inner.num_workers = workers
    inner.prefetch_factor = prefetch
    sampler = loader._sampler
    if getattr(sampler, "lookahead", 0) > 0:
        sampler.lookahead = workers
    cursor = it._cursor
    start = pulled(it)
    draw = getattr(sampler, "draw", None)
    sampler.configure(
        cursor.epoch,
        start,
        draw=draw[1] if draw is not None and draw[0] == cursor.epoch else None,
        tail_done=getattr(sampler, "tail", None) == "done",
    )
    handoff = loader._handoff
    if handoff is not None:
        handoff.reclaim()
        handoff.retire()  # its prefetched slots never come back: unlink the pool
        handoff.count = prefetch * workers + 4
        handoff.begin_epoch()  # a new pool at the new depth (once slots have a size)
    base = loader._position.base_seed  # the same workers' base seed: no new RNG draw
    new_raw = start_workers(inner, {"base_seed": base} if base is not None else None)
    source = new_raw
    coordination = getattr(loader, "_coordination", None)
    if coordination is not None:
        source = coordination.receive(new_raw, cursor.epoch, start)
    it._torch_iter = source
    owning_workers(it, new_raw, loader)
    loader.num_workers = workers
    loader.prefetch_factor = prefetch
    return new_raw
