"""The loader's Ray actors: started once, watched, restarted by Ray, killed at the end.

Each actor reserves ``cpus_per_worker`` (and ``resources``) and restarts wherever Ray
finds room when its process or node is lost (``max_restarts=-1``); Ray retries none of
its tasks (``max_task_retries=0``): the dispatcher re-sends lost batches itself, to any
actor that is up (Ray's ``ActorPool`` would keep sending to a dead one, ray#50313). An
actor counts as up once it has answered ``load()`` (it builds the dataset from the
shipment) since its last loss.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

from unstall.remote.actor import BatchWorker
from unstall.remote.settings import Remote

log = logging.getLogger("unstall")

#: Seconds between two ``load()`` probes of an actor whose probe failed.
PROBE_EVERY_S = 0.5
#: Seconds between two ``load()`` calls of an actor where building the dataset failed.
LOAD_RETRY_S = 10.0


@dataclass(eq=False)
class Actor:
    """One actor and what the dispatcher knows of it."""

    handle: Any
    number: int
    node: str = "?"  # where it last answered from (`actor.where`)
    pid: int = 0
    up: bool = False
    running: int = 0  # batches sent and not yet answered
    probe: Any = None  # the pending ``load()`` call, if any
    probe_at: float = 0.0  # when to probe again after a failed probe
    down_since: float | None = field(default_factory=time.monotonic)
    nodes: set[str] = field(default_factory=set)  # every node it ran on
    load_failed: bool = False  # its ``load()`` raised (said once)


class ActorPool:
    """The actors of one loader and the tasks in flight on them.

    ``inflight`` maps each pending result (an ``ObjectRef``) to its actor and the job
    waiting for it (None once its epoch ended: the answer is then dropped).
    """

    def __init__(self, remote: Remote, shipment_ref: Any):
        import ray

        self.remote = remote
        self.owner_pid = os.getpid()
        cls = ray.remote(BatchWorker)
        options: dict[str, Any] = {
            "num_cpus": remote.cpus_per_worker,
            "max_restarts": -1,
            "max_task_retries": 0,
            "scheduling_strategy": "SPREAD",
        }
        if remote.resources:
            options["resources"] = dict(remote.resources)
        self.shipment_ref = shipment_ref  # kept: a restarted actor is rebuilt from it
        self.actors = [Actor(cls.options(**options).remote(), n) for n in range(remote.workers)]
        self.inflight: dict[Any, tuple[Actor, Any]] = {}
        #: actors sent new batches (the autotuner's choice under ``num_workers="auto"``:
        #: the first this many that are up; the others stay started, idle)
        self.in_use = remote.workers
        for actor in self.actors:
            self._probe(actor)
        self.closed = False

    def _probe(self, actor: Actor) -> None:
        actor.probe = actor.handle.load.remote(self.shipment_ref)

    def probes(self) -> dict[Any, Actor]:
        """Pending ``load()`` calls (probes due again are sent now)."""
        now = time.monotonic()
        for actor in self.actors:
            if not actor.up and actor.probe is None and now >= actor.probe_at:
                self._probe(actor)
        return {a.probe: a for a in self.actors if a.probe is not None}

    def check(self) -> None:
        """Settle the probes answered by now (without waiting)."""
        import ray

        probes = self.probes()
        if probes:
            ready, _ = ray.wait(list(probes), num_returns=len(probes), timeout=0)
            for ref in ready:
                self.answered(probes[ref], ref)

    def wait_up(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for every actor to be up (or to fail to load)."""
        import ray

        deadline = time.monotonic() + timeout
        while self._coming() and (left := deadline - time.monotonic()) > 0:
            probes = self.probes()
            if not probes:  # a probe failed: the next is due soon
                time.sleep(min(left, PROBE_EVERY_S))
                continue
            ready, _ = ray.wait(list(probes), num_returns=1, timeout=min(left, PROBE_EVERY_S))
            for ref in ready:
                self.answered(probes[ref], ref)

    def _coming(self) -> bool:
        """Some actor is neither up nor failing to build the dataset."""
        return any(not (a.up or a.load_failed) for a in self.actors)

    def answered(self, actor: Actor, ref: Any) -> bool:
        """Settle ``actor``'s probe ``ref``; True when the actor came (back) up."""
        import ray
        from ray.exceptions import RayTaskError

        actor.probe = None
        try:
            actor.node, actor.pid = ray.get(ref)
        except RayTaskError as exc:  # the dataset cannot be built there: say so, once
            if not actor.load_failed:
                log.warning(
                    "unstall: remote worker %d cannot build the dataset (%s); local workers "
                    "prepare its share until it can (retried every %g s)",
                    actor.number,
                    str(exc).strip().splitlines()[-1][:300],
                    LOAD_RETRY_S,
                )
            actor.load_failed = True
            actor.probe_at = time.monotonic() + LOAD_RETRY_S
            return False
        except Exception:  # still restarting, or gone for good: probe again later
            actor.probe_at = time.monotonic() + PROBE_EVERY_S
            return False
        actor.up, actor.down_since, actor.load_failed = True, None, False
        actor.nodes.add(actor.node)
        return True

    def lost(self, actor: Actor) -> bool:
        """Mark ``actor`` down (one of its batches failed with it); True if it was up."""
        was_up = actor.up
        actor.up = False
        if actor.down_since is None:
            actor.down_since = time.monotonic()
        if actor.probe is None:
            actor.probe_at = time.monotonic() + PROBE_EVERY_S
        return was_up

    def free_actor(self) -> Actor | None:
        """The up actor in use with the fewest batches running, if it has room for one
        more (a lost actor's place goes to the next one up)."""
        used = [a for a in self.actors if a.up][: self.in_use]
        room = [a for a in used if a.running < self.remote.tasks_per_worker]
        return min(room, key=lambda a: a.running) if room else None

    def up_count(self) -> int:
        return sum(1 for a in self.actors if a.up)

    def down_for(self) -> float:
        """Seconds since the last actor went down with none up since (0 if one is up)."""
        if self.up_count():
            return 0.0
        since = [a.down_since for a in self.actors if a.down_since is not None]
        return time.monotonic() - min(since) if since else 0.0

    def lost_nodes(self) -> list[str]:
        """The nodes the actors last ran on (named in errors when none is left)."""
        return sorted({a.node for a in self.actors} | {n for a in self.actors for n in a.nodes})

    def send(self, actor: Actor, job: Any) -> Any:
        """Send ``job``'s batch to ``actor``; the pending result."""
        batch = job.batch
        ref = actor.handle.run.remote(list(batch), batch.key, batch.reseed)
        actor.running += 1
        self.inflight[ref] = (actor, job)
        return ref

    def settle(self, ref: Any) -> tuple[Actor, Any]:
        """Forget the answered ``ref``: ``(its actor, its job or None)``."""
        actor, job = self.inflight.pop(ref)
        actor.running = max(0, actor.running - 1)
        return actor, job

    def orphan(self, refs: list[Any]) -> None:
        """An epoch ended: its pending results are dropped when they come."""
        import ray

        for ref in refs:
            if ref in self.inflight:
                self.inflight[ref] = (self.inflight[ref][0], None)
                with contextlib.suppress(Exception):  # queued ones never run
                    ray.cancel(ref)

    def close(self) -> None:
        """Kill every actor (only in the process that started them); safe to call twice."""
        if self.closed or os.getpid() != self.owner_pid:
            return
        self.closed = True
        self.inflight.clear()
        with contextlib.suppress(Exception):
            import ray

            if ray.is_initialized():
                for actor in self.actors:
                    with contextlib.suppress(Exception):
                        ray.kill(actor.handle, no_restart=True)
        self.actors = []
        self.shipment_ref = None
