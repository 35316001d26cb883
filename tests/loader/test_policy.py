"""The tuner's walk (`unstall.loader.autotune.policy`) on synthetic windows, derived by hand:
window lengths, a grow judged and kept, a grow that did not pay undone (its bound held
`HOLD_S`), a shrink after two windows, a shrink that made the loop wait undone."""

from __future__ import annotations

from dataclasses import replace

from unstall.loader.autotune import Budget, Window, policy
from unstall.loader.autotune.policy import (
    FIRST_WINDOW_S,
    GROW_UNDONE,
    HOLD_S,
    JUDGE_SCALE,
    SHRINK_UNDONE,
    WINDOW_BATCHES,
    WINDOW_S,
    State,
    step,
)


def _window(workers, *, wait=0.0, util=1.0, batches=20, wall=1.0, prefetch=2):
    busy = util * wall * workers
    return Window(batches, wall, wait * wall, busy, busy, 0.0, workers, prefetch)


def test_window_lengths_short_first_judging_doubled_settled_lengthen():
    s = State()
    assert s.window_s(0.0) == FIRST_WINDOW_S
    assert not s.window_done(FIRST_WINDOW_S, 0.0, WINDOW_BATCHES - 1)  # too few batches
    assert s.window_done(FIRST_WINDOW_S, 0.0, WINDOW_BATCHES)
    judging = replace(s, windows=1, pending=policy.Pending(_window(1), None))
    assert judging.window_s(0.0) == JUDGE_SCALE * WINDOW_S
    assert [replace(s, windows=1, settled=k).window_s(0.0) for k in range(6)] == [
        WINDOW_S * f for f in (1, 2, 4, 8, 8, 8)
    ]
    # a loop that waits gets the base length, however settled
    assert replace(s, windows=1, settled=3).window_s(0.5) == WINDOW_S


def test_a_grow_that_pays_is_kept_and_the_same_window_decides_on():
    # 1 worker, the loop waits 60 %: the rule asks 3 (a 50 ms task, 20 ms of the loop's own)
    d, s = step(State(), _window(1, wait=0.6), Budget(cores=8), now=0.0)
    assert (d.workers, d.why, s.windows, s.settled) == (3, "loop waits, cores free", 1, 0)
    assert s.pending.before == _window(1, wait=0.6)
    # at 3 the rate doubled and the loop no longer waits: kept, nothing more asked
    d, s = step(s, _window(3, wait=0.0, batches=40), Budget(cores=8), now=1.0)
    assert d is None and s.pending is None and s.settled == 1 and s.ceiling == policy.UNBOUNDED


def test_a_grow_that_did_not_pay_is_undone_and_bounded_for_the_hold():
    s = replace(State(windows=3), pending=policy.Pending(_window(2, wait=0.3), None))
    # at 3 the same rate (20 batches/s) and the wait only down to 0.2 (> 0.15, > PAID_WAIT)
    d, s = step(s, _window(3, wait=0.2), Budget(cores=8), now=10.0)
    assert (d.workers, d.why) == (2, GROW_UNDONE)
    assert (s.ceiling, s.hold_until, s.pending, s.settled) == (2, 10.0 + HOLD_S, None, 0)
    # back at 2 the loop still waits, but the bound holds the pool: nothing asked
    d, s = step(s, _window(2, wait=0.3), Budget(cores=8), now=11.0)
    assert d is None and s.settled == 1
    # once the hold is over the rule may grow again
    d, s = step(s, _window(2, wait=0.3), Budget(cores=8), now=10.0 + HOLD_S)
    assert d is not None and d.workers > 2 and s.ceiling == policy.UNBOUNDED


def test_a_shrink_needs_two_windows_and_one_that_makes_the_loop_wait_is_undone():
    idle = _window(4, util=0.1)
    d, s = step(State(windows=2), idle, Budget(cores=8), now=0.0)
    assert d is None and s.shrink_votes == 1 and s.settled == 1
    d, s = step(s, idle, Budget(cores=8), now=1.0)
    assert (d.workers, d.why, s.shrink_votes) == (1, "workers idle", 0)
    # at 1 the loop waits 40 % and the rate fell under 1 / GAIN of it: undone, floor 4
    d, s = step(s, _window(1, wait=0.4, batches=10), Budget(cores=8), now=2.0)
    assert (d.workers, d.why, s.floor, s.hold_until) == (4, SHRINK_UNDONE, 4, 2.0 + HOLD_S)
    assert policy.undoes(d)
    d, s = step(s, idle, Budget(cores=8), now=3.0)  # idle again: the floor holds it
    assert d is None


def test_a_change_from_outside_is_recorded_never_judged():
    d, s = policy.scheduled(State(), policy.Decision(3, 2, "schedule"), 1, 2)
    assert d.workers == 3 and s.pending == policy.Pending(None, None)
    d, s = step(s, _window(3, wait=0.0, util=0.9), Budget(cores=8), now=0.0)
    assert d is None and s.pending is None  # no window before it: nothing to judge
    assert policy.scheduled(s, policy.Decision(3, 2, "schedule"), 3, 2) == (None, s)


# Remote workers (issue 45): local ones fill first, remote ones take the overflow ------------
REMOTE = Budget(cores=2, remote_cap=4)


def _remote(workers, remote, *, wait=0.0, util=1.0, remote_busy=None, batches=20):
    busy = util * workers
    extra = remote * 1.0 if remote_busy is None else remote_busy
    return Window(batches, 1.0, wait, busy, busy, 0.0, workers, 2, remote, extra)


def test_remote_workers_take_the_overflow_once_the_local_ones_are_at_their_cap():
    # 2 local CPU-bound workers on 2 cores: at the cap. The loop waits 60 %: its own 20 ms a
    # batch against 100 ms of task: 5 workers needed, 3 of them remote
    d, s = step(State(windows=1), _remote(2, 0, wait=0.6), REMOTE, now=0.0)
    assert (d.workers, d.remote, d.why) == (2, 3, "loop waits, local workers at their cap")
    # at 3 remote the loop no longer waits: kept, and 5 busy workers keep them all
    d, s = step(s, _remote(2, 3, batches=40), REMOTE, now=1.0)
    assert d is None and s.pending is None and s.remote_ceiling == policy.UNBOUNDED
    # with cores free the local pool grows first, the remote one stays unused
    d, _ = step(State(windows=1), _remote(1, 0, wait=0.6), REMOTE, now=0.0)
    assert (d.workers, d.remote) == (2, None)
    # without remote workers nothing is asked at the cap
    assert step(State(windows=1), _remote(2, 0, wait=0.6), Budget(cores=2), now=0.0)[0] is None


def test_remote_workers_that_do_not_pay_are_given_back_and_bounded_for_the_hold():
    s = replace(State(windows=3), pending=policy.Pending(_remote(2, 0, wait=0.6), None))
    # 3 remote in use, the same rate and the loop still waiting 50 %: undone to 0
    d, s = step(s, _remote(2, 3, wait=0.5), REMOTE, now=10.0)
    assert (d.workers, d.remote, d.why) == (2, 0, GROW_UNDONE)
    assert (s.remote_ceiling, s.ceiling, s.hold_until) == (0, policy.UNBOUNDED, 10.0 + HOLD_S)
    assert step(s, _remote(2, 0, wait=0.6), REMOTE, now=11.0)[0] is None  # the bound holds
    d, s = step(s, _remote(2, 0, wait=0.6), REMOTE, now=10.0 + HOLD_S)
    assert d.remote == 3 and s.remote_ceiling == policy.UNBOUNDED


def test_idle_remote_workers_go_back_before_any_local_one():
    # local workers busy 25 %, remote ones 0.3 s of task in 1 s: 0.8 busy workers x 1.3 ->
    # 2, which the 2 local ones give: no remote one kept (two windows in a row, as a shrink)
    idle = _remote(2, 3, util=0.25, remote_busy=0.3)
    d, s = step(State(windows=2), idle, REMOTE, now=0.0)
    assert d is None and s.shrink_votes == 1
    d, s = step(s, idle, REMOTE, now=1.0)
    assert (d.workers, d.remote, d.why) == (2, 0, "workers idle")
    # after which the loop waits and the rate fell: undone, 3 held as the floor
    d, s = step(s, _remote(2, 0, wait=0.6, batches=10, util=0.25), REMOTE, now=2.0)
    assert (d.workers, d.remote, d.why, s.remote_floor) == (2, 3, SHRINK_UNDONE, 3)
