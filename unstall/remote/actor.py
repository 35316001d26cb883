"""What runs on a remote node: one Ray actor that prepares whole batches.

The actor builds the loader's batch task once, from the `Shipment` the trainer put in
Ray's object store (sent with ``load``, the first call of each life of the actor: an actor
that restarts with an object-store argument draws one Ray error line per actor,
ray#53727), and then prepares the index lists it is sent. A batch is a function
of (seed, epoch, batch index) alone (`unstall.pipeline.batch_seed`), so the same batch
prepared here, on another actor or by a local worker is bit-identical: re-sending a lost
one elsewhere is harmless. A dataset's error comes back as a `TaskFailure` naming the
sample and this node, re-raised in the training loop as a local worker's would be.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Any

from torch._utils import ExceptionWrapper

from unstall.errors import SampleError
from unstall.loader.failures import TaskFailure
from unstall.loader.fetch import BatchTask
from unstall.loader.sampling import planned_batch
from unstall.remote.wire import to_wire


@dataclass(frozen=True)
class Shipment:
    """What every actor needs to prepare a batch, put in the object store once."""

    dataset: Any
    collate_fn: Any
    unbatched: bool


@dataclass(frozen=True)
class Done:
    """One prepared batch: its payload (`wire.to_wire`), its bytes, and the worker's
    seconds fetching and preparing it."""

    payload: Any
    nbytes: int
    fetch_s: float
    prep_s: float


def where() -> str:
    """This process's node, as the loader names it: ``host (node id prefix)``."""
    node = ""
    try:
        import ray

        node = ray.get_runtime_context().get_node_id()[:8]
    except Exception:  # not in a Ray worker
        node = "?"
    return f"{socket.gethostname()} ({node})"


class Unloaded:
    """What `BatchWorker.run` answers before ``load``: the actor restarted unseen."""


class BatchWorker:
    """A Ray actor's body: the batch task, built once, run for each batch sent."""

    def __init__(self) -> None:
        self.task: BatchTask | None = None
        self.node = where()

    def load(self, shipment: Shipment) -> tuple[str, int]:
        """Build the batch task (once a life); ``(node, pid)``: the actor is up."""
        if self.task is None:
            s = shipment
            self.task = BatchTask(s.dataset, s.collate_fn, unbatched=s.unbatched)
        return self.node, os.getpid()

    def run(self, indices: list[int], key: Any, reseed: bool) -> Done | TaskFailure | Unloaded:
        """Prepare the batch ``indices`` (whose seed key is ``key``)."""
        if self.task is None:
            return Unloaded()
        t0 = time.perf_counter()
        batch = planned_batch(indices, [], key, reseed)
        try:
            out, timing = self.task[batch]
        except Exception as exc:  # the dataset's own error: the loop re-raises it
            return self._failure(exc)
        payload, nbytes = to_wire(out)
        fetch_s, prep_s = timing
        prep_s += time.perf_counter() - t0 - fetch_s - prep_s  # collate and wire too
        return Done(payload, nbytes, fetch_s, prep_s)

    def _failure(self, exc: Exception) -> TaskFailure:
        here = f"unstall remote worker pid {os.getpid()} on {self.node}"
        notes = [n.replace("the main process", here) for n in getattr(exc, "__notes__", [])]
        ours = [n for n in notes if n.startswith("unstall:")]
        exc.__notes__ = [n for n in notes if not n.startswith("unstall:")]  # type: ignore[attr-defined]
        wrapper = ExceptionWrapper(sys.exc_info(), where=f"in {here}")
        index = exc.index if isinstance(exc, SampleError) else None
        key = exc.key if isinstance(exc, SampleError) else None
        return TaskFailure(wrapper, "; ".join(ours) or f"unstall: raised in {here}", index, key)
