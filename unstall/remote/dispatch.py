"""One epoch's batches shared between local workers and remote actors, handed out in order.

The loader's plan (`unstall.loader.sampling`) stays the only source of batches. torch's
local workers pull from it first, through `SplitSampler` (their prefetch fills when the
epoch starts and refills as each of their batches is handed out); the remote actors
take the next batches whenever one is up with room, the bytes cap allows, and the
reorder window has space. `Merged` then hands out batch ``b``, ``b + 1``, ... from
whichever side has it, so the training loop sees the loader's own order.

A batch whose actor is lost (its process or node) is re-sent to another that is up:
a batch is a function of (seed, epoch, index), so no sample is lost or repeated. With
no actor up for ``timeout_s``, the waiting batches are prepared in this process (and
remote sending stops for the epoch) or an error names the lost nodes (``fallback``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from unstall.loader.failures import add_note, is_task_error, mark_task_error
from unstall.loader.fetch import Timing
from unstall.remote.actor import Unloaded
from unstall.remote.wire import from_wire

log = logging.getLogger("unstall")

#: Times one batch may lose its worker before the loader gives up on it (a sample that
#: kills the process preparing it would otherwise go round the cluster for ever).
MAX_LOSSES = 3
#: Longest single wait for a remote answer before re-checking losses and time-outs [s].
POLL_S = 0.1


@dataclass(eq=False)
class Job:
    """A batch sent to the remote workers, until it is handed out."""

    b: int  # its number in the epoch
    batch: Any  # its indices (a `Planned`, with the key its draws are seeded from)
    ref: Any = None  # the pending result
    losses: int = 0


@dataclass(eq=False)
class EpochRun:
    """Who prepares each batch of one epoch, and the remote batches not yet handed out.

    ``plan``: the epoch's batches from ``next_pull`` (its first) on, for ``owner``;
    ``local``: numbers of the batches torch's workers took, in order; ``jobs``: remote
    batches by number; ``arrived``: remote batches received, waiting for their turn;
    ``waiting``: jobs whose actor was lost, to send again.
    """

    plan: Iterator[Any]
    next_pull: int
    owner: Any
    next_out: int = field(init=False)  # the next batch handed out: the first, at the start
    exhausted: bool = False
    closed: bool = False
    fallback: bool = False  # no remote worker left: this epoch's batches are local
    local: deque[int] = field(default_factory=deque)
    jobs: dict[int, Job] = field(default_factory=dict)
    arrived: dict[int, Any] = field(default_factory=dict)
    waiting: deque[Job] = field(default_factory=deque)

    def __post_init__(self) -> None:
        self.next_out = self.next_pull

    # Pulling from the plan ----------------------------------------------------------
    def pull(self, *, local: bool) -> tuple[int, Any] | None:
        if self.exhausted or self.closed:
            return None
        try:
            batch = next(self.plan)
        except StopIteration:
            self.exhausted = True
            return None
        b, self.next_pull = self.next_pull, self.next_pull + 1
        if local:
            self.local.append(b)
        return b, batch

    def local_batches(self) -> Iterator[Any]:
        """What torch's sampler yields: the batches local workers take, as they ask."""
        while (got := self.pull(local=True)) is not None:
            yield got[1]

    # Sending -----------------------------------------------------------------------
    def top_up(self) -> None:
        """Send lost batches again, then new ones, while an actor is up with room."""
        pool, o = self.owner.pool, self.owner
        while self.waiting and not self.fallback and (actor := pool.free_actor()) is not None:
            self._send(actor, self.waiting.popleft())
        cap = o.settings.max_bytes_in_flight
        while not (self.exhausted or self.fallback) and len(self.jobs) < o.window:
            if (len(self.jobs) + 1) * o.counters.batch_bytes > cap and self.jobs:
                break  # the bytes cap: nothing more until a remote batch is handed out
            actor = pool.free_actor()
            if actor is None:
                break
            got = self.pull(local=False)
            if got is None:
                break
            job = Job(*got)
            self.jobs[job.b] = job
            self._send(actor, job)

    def _send(self, actor: Any, job: Job) -> None:
        job.ref = self.owner.pool.send(actor, job)

    # Receiving ---------------------------------------------------------------------
    def poll(self, timeout: float) -> None:
        """Take every answer in (waiting up to ``timeout`` for the first), then top up."""
        import ray

        pool = self.owner.pool
        probes = pool.probes()
        refs = [*pool.inflight, *probes]
        if refs:
            ready, _ = ray.wait(refs, num_returns=1, timeout=timeout, fetch_local=True)
            if ready:
                ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=True)
            for ref in ready:
                if ref in probes:
                    pool.answered(probes[ref], ref)
                else:
                    actor, job = pool.settle(ref)
                    if job is not None and not self.closed:
                        self._arrived(actor, job, ref)
        elif timeout:
            time.sleep(min(timeout, POLL_S))
        self.top_up()

    def _arrived(self, actor: Any, job: Job, ref: Any) -> None:
        import ray
        from ray.exceptions import RayError, RayTaskError

        t0 = time.perf_counter()
        try:
            out = ray.get(ref)
        except RayTaskError as exc:  # the actor's code failed outside the dataset
            add_note(exc, f"unstall: batch {job.b} of dataset indices {list(job.batch)}")
            self.arrived[job.b] = exc
            return
        except RayError as exc:  # the actor's process or node is gone
            self._lost(actor, job, exc)
            return
        if isinstance(out, Unloaded):  # it restarted unseen: load it again, send the batch again
            self._lost(actor, job, RuntimeError("restarted"))
            return
        done = getattr(out, "payload", None)
        if done is None and not hasattr(out, "nbytes"):  # a `TaskFailure`: raised at its turn
            self.arrived[job.b] = (out, Timing(0.0, 0.0))
            return
        batch = from_wire(out.payload)
        transfer = time.perf_counter() - t0
        self.owner.counters.received(actor.node, out.nbytes, out.fetch_s + out.prep_s, transfer)
        self.arrived[job.b] = (batch, Timing(out.fetch_s, out.prep_s, remote=True))

    def _lost(self, actor: Any, job: Job, exc: BaseException) -> None:
        o = self.owner
        if o.pool.lost(actor):
            log.warning(
                "unstall: remote worker %d on %s lost (%s); its batches go to other workers",
                actor.number,
                actor.node,
                type(exc).__name__,
            )
        o.counters.node(actor.node).failures += 1
        o.counters.resent += 1
        job.losses += 1
        if job.losses >= MAX_LOSSES:
            raise RuntimeError(
                f"batch {job.b} of dataset indices {list(job.batch)} lost its remote worker "
                f"{job.losses} times (last on {actor.node}: {exc}); a sample of it may crash "
                "the process preparing it"
            )
        self.waiting.append(job)

    def wait_for(self, b: int) -> Any:
        """Remote batch ``b``, once it has arrived (or prepared here after a fallback)."""
        o = self.owner
        while b not in self.arrived:
            job = self.jobs[b]
            lost = job in self.waiting and o.pool.up_count() == 0
            if lost and (self.fallback or o.pool.down_for() >= o.settings.timeout_s):
                self._fall_back()
                self.waiting.remove(job)
                o.counters.fallback_batches += 1
                return o.local_task[job.batch]
            self.poll(POLL_S)
        item = self.arrived.pop(b)
        if isinstance(item, BaseException):
            mark_task_error(item)
            raise item
        return item

    def _fall_back(self) -> None:
        o = self.owner
        nodes = ", ".join(o.pool.lost_nodes())
        if o.settings.fallback == "raise":
            raise RuntimeError(
                f"no remote worker answered for {o.settings.timeout_s:g} s (nodes: {nodes}); "
                f"{len(self.waiting)} batches wait for one: restart the nodes, or pass "
                "Remote(fallback='local') to prepare them here"
            )
        if not self.fallback:
            log.warning(
                "unstall: no remote worker answered for %g s (nodes: %s); preparing this "
                "epoch's remaining batches locally",
                o.settings.timeout_s,
                nodes,
            )
            self.fallback = True

    def close(self) -> None:
        """The epoch ended (or its iterator went): drop what is still on its way."""
        if self.closed:
            return
        self.closed = True
        self.owner.pool.orphan([job.ref for job in self.jobs.values() if job.ref is not None])
        self.jobs.clear()
        self.arrived.clear()
        self.waiting.clear()


class Merged:
    """The epoch's ``(batch, timing)`` pairs in the loader's order, from both sides.

    Stands in for torch's iterator in the loader's epoch iterator; torch's own attributes
    (``_workers``...) read through.
    """

    def __init__(self, run: EpochRun, torch_iter: Iterator[Any]):
        self._run = run
        self._torch_iter = torch_iter

    def __getattr__(self, name: str) -> Any:
        inner = self.__dict__.get("_torch_iter")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def __iter__(self) -> Merged:
        return self

    def __next__(self) -> Any:
        run = self._run
        b = run.next_out
        try:
            run.poll(0)
            item = self._remote(b) if b in run.jobs else self._local(b)
        except StopIteration:
            run.close()
            raise
        except BaseException as exc:
            if is_task_error(exc):  # one batch's error: the epoch goes on from the next
                run.jobs.pop(b, None)
                if run.local and run.local[0] == b:
                    run.local.popleft()
                run.next_out += 1
            raise
        run.next_out += 1
        return item

    def _remote(self, b: int) -> Any:
        item = self._run.wait_for(b)
        del self._run.jobs[b]
        return item

    def _local(self, b: int) -> Any:
        """Batch ``b`` from torch's iterator (with no workers, torch prepares it here now)."""
        run = self._run
        if run.local and run.local[0] != b:
            raise RuntimeError(f"remote dispatch out of step: batch {b} is nobody's")
        if not run.local and run.exhausted:
            raise StopIteration
        try:
            item = next(self._torch_iter)
        except StopIteration:
            if run.jobs or run.local:
                owed = len(run.jobs) + len(run.local)
                raise RuntimeError(
                    f"torch's workers ended the epoch at batch {b} with {owed} batches owed"
                ) from None
            raise
        run.local.popleft()
        run.owner.counters.local_batches += 1
        return item

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self._run.close()
