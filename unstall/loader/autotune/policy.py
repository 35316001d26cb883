"""The tuner's walk: after each window of measurements, what the pool does next.

Pure: a `Window` (what was measured), a `Budget` (what the pool may take) and the walk's
`State` in; a `Decision` (or None: keep the pool) and the next `State` out. The live
tuner (`controller.AutoTuner`) feeds it the windows it measures; ``unstall analyze``
(`unstall.analysis.recommend.auto`) feeds it the windows its model predicts, so both
walk the same way. The rule (`rule.decide`) picks a pool from one window; the walk adds
what needs more than one:

* judging: the window after a change judges it. A grow that neither raised the rate
  by `GAIN` nor halved the loop's wait (nor left it under `PAID_WAIT`) is undone, a
  shrink after which the loop waits and the rate fell is undone; the count it left
  stays the bound for `HOLD_S` seconds;
* a shrink needs two windows in a row that ask for it;
* window lengths (`State.window_s`): the first is short (`FIRST_WINDOW_S`: a pool far
  from the right size is plain at once); the one that judges a change lasts
  `JUDGE_SCALE` base windows; once settled they lengthen (to 8x), except while the
  loop waits (costs went up: react within a window);
* remote workers (``remote=``, issue 45) are judged the same way: a grow into them that
  did not pay is undone and the count it left bounds them for `HOLD_S` (they stay started
  on the cluster, unused); a shrink of them after which the loop waits is undone.

Every constant of the walk is here; the rule's own (`GROW_WAIT`...) are in `rule`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from unstall.loader.autotune.rule import GROW_WAIT, IDLE, Budget, Decision, Window, decide

#: The value that asks for tuning (``num_workers="auto"``, ``prefetch_factor="auto"``).
AUTO = "auto"

#: A window lasts at least this long and `WINDOW_BATCHES` batches (doubling once settled,
#: to 8x).
WINDOW_S = 0.3
#: The first window of a loader lasts this long (at least `WINDOW_BATCHES` batches).
FIRST_WINDOW_S = 0.1
WINDOW_BATCHES = 6
#: The window after a change (the one that judges it) lasts this many base windows.
JUDGE_SCALE = 2
#: A new pool's first ``WARMUP_ROUNDS x workers x prefetch`` batches are not measured
#: (workers starting, connections opening, the prefetch filling).
WARMUP_ROUNDS = 2
#: A grow must raise the rate by this factor to stay.
GAIN = 1.05
#: A grow pays whatever the rate did when the loop then waits at most this share of its time.
PAID_WAIT = 0.02
#: How long a bound set by a change that did not pay holds [s].
HOLD_S = 30.0
#: Starting workers for ``num_workers="auto"`` (fewer with fewer cores).
START_WORKERS = 1
#: Starting prefetch for ``prefetch_factor="auto"``.
START_PREFETCH = 2
#: No bound (workers, requests in flight).
UNBOUNDED = 1 << 16
#: Why a change is undone (`Decision.why`).
GROW_UNDONE = "the grow did not pay"
SHRINK_UNDONE = "the shrink made it wait"


@dataclass(frozen=True)
class Pending:
    """A change waiting for the window that judges it: the window it was decided on
    (None: made from outside the rule, never judged) and the requests in flight before."""

    before: Window | None
    inflight: int | None


@dataclass(frozen=True)
class State:
    """Where the walk stands (the pool itself is the window's: ``Window.workers``)."""

    inflight: int | None = None  # requests in flight per worker (None: not turned)
    windows: int = 0  # windows closed
    settled: int = 0  # windows in a row without a change
    shrink_votes: int = 0  # windows in a row that asked for a shrink
    floor: int = 1  # bounds held after a change that did not pay
    ceiling: int = UNBOUNDED
    inflight_ceiling: int = UNBOUNDED
    remote_floor: int = 0  # bounds held on the remote workers in use
    remote_ceiling: int = UNBOUNDED
    hold_until: float = 0.0  # [s] on the caller's clock
    pending: Pending | None = None

    def window_s(self, wait: float) -> float:
        """How long the open window lasts at least [s], the loop waiting ``wait`` of its
        time so far."""
        base = FIRST_WINDOW_S if self.windows == 0 else WINDOW_S
        if self.pending is not None:  # the window that judges a change
            return base * JUDGE_SCALE
        return base * (1 << (0 if wait > GROW_WAIT else min(self.settled, 3)))

    def window_done(self, wall_s: float, wait_s: float, batches: int) -> bool:
        """Whether the open window (``batches`` over ``wall_s``, ``wait_s`` of it waiting in
        ``next()``) is long enough to close."""
        wait = wait_s / wall_s if wall_s > 0 else 0.0
        return wall_s >= self.window_s(wait) and batches >= WINDOW_BATCHES


def warmup_batches(workers: int, prefetch: int) -> int:
    """Batches a new pool hands out before it is measured."""
    return WARMUP_ROUNDS * workers * prefetch


def undoes(d: Decision) -> bool:
    """Whether ``d`` undoes the change before it (its window showed it did not pay)."""
    return d.why in (GROW_UNDONE, SHRINK_UNDONE)


def step(
    state: State,
    w: Window,
    budget: Budget,
    *,
    now: float,
    tune_workers: bool = True,
    tune_prefetch: bool = False,
    queued: bool = False,
) -> tuple[Decision | None, State]:
    """One closed window ``w`` under ``budget`` at time ``now`` [s]: the change to make
    (None: keep the pool) and the walk's next state.

    ``queued``: requests waited for a slot over the window (`rule.decide`).
    """
    state = replace(state, windows=state.windows + 1)
    undo, state = _judge(state, w, now)
    if undo is not None:
        d, state = _change(state, undo, w, w.workers, w.prefetch, w.remote)
        return d, replace(state, pending=None)  # an undo is not judged in turn
    if now >= state.hold_until:
        state = replace(
            state,
            floor=1,
            ceiling=UNBOUNDED,
            inflight_ceiling=UNBOUNDED,
            remote_floor=0,
            remote_ceiling=UNBOUNDED,
        )
    d = decide(
        w,
        budget,
        tune_workers=tune_workers,
        tune_prefetch=tune_prefetch,
        floor=state.floor,
        ceiling=state.ceiling,
        inflight=state.inflight,
        inflight_ceiling=state.inflight_ceiling,
        queued=queued,
        remote_floor=state.remote_floor,
        remote_ceiling=state.remote_ceiling,
    )
    if d is not None and d.why == IDLE and _shrinks(d, w):
        state = replace(state, shrink_votes=state.shrink_votes + 1)
        if state.shrink_votes < 2:  # a shrink needs two windows in a row
            d = None
    else:
        state = replace(state, shrink_votes=0)
    if d is None:
        return None, replace(state, settled=state.settled + 1)
    return _change(state, d, w, w.workers, w.prefetch, w.remote)


def _shrinks(d: Decision, w: Window) -> bool:
    """Whether ``d`` takes workers away from the pool of ``w``, local or remote."""
    return d.workers < w.workers or (d.remote is not None and d.remote < w.remote)


def scheduled(
    state: State, d: Decision, workers: int, prefetch: int
) -> tuple[Decision | None, State]:
    """A change made from outside the rule (a test's schedule) on a pool of ``workers`` x
    ``prefetch``: recorded like the rule's, never judged."""
    return _change(state, d, None, workers, prefetch)


def _change(
    state: State,
    d: Decision,
    before: Window | None,
    workers: int,
    prefetch: int,
    remote: int = 0,
) -> tuple[Decision | None, State]:
    inflight = d.inflight if d.inflight is not None else state.inflight
    same_remote = d.remote is None or d.remote == remote
    if (d.workers, d.prefetch, inflight) == (workers, prefetch, state.inflight) and same_remote:
        return None, state  # nothing changes
    pending = Pending(before, state.inflight)
    state = replace(state, pending=pending, settled=0, shrink_votes=0, inflight=inflight)
    return replace(d, inflight=inflight), state


def _judge(state: State, w: Window, now: float) -> tuple[Decision | None, State]:
    """The undo of the pending change if ``w`` (the first window after it) shows it did
    not pay, with the bound it leaves; the change is judged either way."""
    last, state = state.pending, replace(state, pending=None)
    if last is None or last.before is None:
        return None, state
    before, was = last.before, last.inflight
    more_requests = (state.inflight or 0) > (was or 0)
    more_remote = w.remote > before.remote
    grew = w.workers > before.workers or w.prefetch > before.prefetch or more_requests
    grew = grew or more_remote
    paid = w.rate >= before.rate * GAIN or w.wait <= before.wait / 2 or w.wait <= PAID_WAIT
    remote = before.remote if w.remote != before.remote else None  # the undo's remote count
    undo = None
    if grew and not paid:
        if more_requests:
            state = replace(state, inflight_ceiling=was if was is not None else 0)
        elif more_remote:
            state = replace(state, remote_ceiling=before.remote)
        else:
            state = replace(state, ceiling=before.workers)
        undo = Decision(before.workers, before.prefetch, GROW_UNDONE, was, remote)
    elif (
        (w.workers < before.workers or w.remote < before.remote)
        and w.wait > GROW_WAIT
        and w.rate < before.rate / GAIN
    ):
        if w.remote < before.remote:
            state = replace(state, remote_floor=before.remote)
        else:
            state = replace(state, floor=before.workers)
        undo = Decision(before.workers, before.prefetch, SHRINK_UNDONE, was, remote)
    if undo is not None:
        state = replace(state, hold_until=now + HOLD_S)
    return undo, state


def start_workers(cores: int, ranks: int = 1, claimed: int = 0) -> int:
    """The pool ``num_workers="auto"`` starts with: `START_WORKERS`, within this rank's share of
    the node's ``cores`` (``ranks`` of one job on the node) and the cores the job's other
    ranks have not ``claimed``; at least 1. The live tuner starts here, and `unstall analyze`
    prices the walk from here (`unstall.analysis.recommend.auto.settle`)."""
    return max(1, min(START_WORKERS, cores // max(1, ranks), cores - claimed))
