"""``num_workers="auto"`` priced for this job: where the autotuner would settle, and what the
batches it spends getting there cost.

The loader's tuner (`unstall.loader.autotune`) is not re-implemented here: its own walk
(`policy.step`: the rule, the judging of each change, the shrink's second window, the
window lengths) is fed, window after window, the windows the model predicts this job
would show at each pool size (the loop's wait, the workers' task, CPU and run-queue
time), under the budget its resources would give it on this machine (the cores less the
training process's busy cores, shared between the ranks on the node, grown only into
idle cores). The walk starts where the tuner starts (`START_WORKERS`, within the ranks'
share), follows each decision (a change the next window shows did not pay is undone, as
the tuner undoes it), and stops where the walk asks for nothing more, or where it would
go back to a count it left (it would alternate: priced at the slower of the two).

The price is the rate over a run as long as the measured window (what ``--verify``
measures): the settled pool's predicted rate, less the time the smaller pools spent on
their batches (each new pool's unjudged batches and its window, at that pool's rate) and
the prefetched batches each change makes again. A longer job pays the same settling over
more batches: its rate comes closer to the settled one (``settled_samples_per_s``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from unstall.analysis.model.predict import Config, Prediction, fetch_seconds_per_batch, predict
from unstall.analysis.rates.result import Rates
from unstall.analysis.recommend.option import Job, Option, option
from unstall.loader.autotune import AUTO, Budget, Window, policy
from unstall.loader.autotune.policy import (
    GROW_UNDONE,
    WINDOW_BATCHES,
    WINDOW_S,
    undoes,
    warmup_batches,
)
from unstall.loader.autotune.resources import cores_left, training_cores

#: ``"auto"`` is recommended when its price is within this share of the best fixed setting's
#: prediction and a fixed count is fragile on this job (`fragile`).
MARGIN = 0.05
#: The most windows the walk follows (the tuner settles in a few).
MAX_WINDOWS = 64
#: Caps of the model that mean the workers are the bottleneck (they never sit idle then).
WORKER_CAPS = ("prep", "workers", "cores")


@dataclass
class Settling:
    """The tuner's walk for this job: the pools it runs, and where it stays.

    Attributes:
        path: worker counts in the order the tuner runs them (the first is its start).
        batches: batches each pool but the last hands out before the next change.
        settled: the count it stays at; ``prediction`` its predicted rate.
        lost_s: seconds those batches and the remade prefetched ones cost against the
            settled pool's rate.
        undone: why the walk ended on an undone change, (``"grow"`` or ``"shrink"``, the
            count it would have run, again), or (``"alternates"``, the two counts it would
            alternate between); None: the rule asked for nothing.
        whys: why each change of ``path`` (and each undone one) was asked.
        walk: every count the tuner runs in order, undone changes included.
    """

    path: list[int]
    batches: list[int]
    settled: int
    prediction: Prediction
    lost_s: float
    undone: tuple[str, int, int] | None = None
    whys: list[str] = field(default_factory=list)
    walk: list[int] = field(default_factory=list)


def window_at(rates: Rates, config: Config, *, prefetch: int, seconds: float = WINDOW_S) -> Window:
    """The window the tuner would measure on ``config``'s pool, by the model, lasting at
    least ``seconds`` and `WINDOW_BATCHES` batches: the loop waits for what the pool's rate
    lacks of the model's own; the workers spend CPU and I/O on each batch, and while they
    are the bottleneck the rest of their time is waiting for a core (the cores are full)."""
    p = predict(rates, config)
    b = config.batch_size
    rate = max(p.samples_per_s, 1e-9)
    batches = max(WINDOW_BATCHES, math.ceil(seconds * rate / b))
    wall = batches * b / rate
    own = b / rates.ingestion if rates.ingestion > 0 else 0.0
    if rates.main_cpu_s > 0:
        own = max(own, b * rates.main_cpu_s)
    wait = max(0.0, wall - batches * own)
    cpu = b * rates.prep_cpu_s
    io = fetch_seconds_per_batch(rates, config, p.hit_rate)
    binding = min(p.caps, key=lambda k: p.caps[k])
    task = config.workers * b / rate  # a worker's wall time per batch it makes
    runq = max(0.0, task - cpu - io) if binding in WORKER_CAPS else 0.0
    return Window(
        batches=batches,
        wall_s=wall,
        wait_s=wait,
        busy_s=batches * (cpu + io + runq),
        cpu_s=batches * cpu,
        runq_s=batches * runq,
        workers=config.workers,
        prefetch=prefetch,
    )


def budget_at(
    rates: Rates, config: Config, *, node_cores: int, ranks: int, others: float
) -> Budget:
    """What the tuner's resources would allow on this machine with ``config``'s pool running:
    the node's cores less the training process's busy cores (its CPU per sample x the rate),
    a fair share among ``ranks`` on the node, and the cores no one uses (``others``: cores
    other processes kept busy)."""
    rate = predict(rates, config).samples_per_s
    training = training_cores(rates.process_cpu_s * rate, 1.0)
    r = max(1, ranks)
    cores = cores_left(node_cores, training, 0, r - 1, int(r > 1))
    used = r * rate * (rates.prep_cpu_s + rates.process_cpu_s)
    return Budget(cores, idle=max(0.0, node_cores - others - used))


def settle(
    rates: Rates,
    base: Config,
    *,
    node_cores: int,
    prefetch: int = 2,
    ranks: int = 1,
    others: float = 0.0,
) -> Settling:
    """Where ``num_workers="auto"`` would settle on this job, and the walk there."""
    r = max(1, ranks)
    start = policy.start_workers(node_cores, r)
    at = lambda n: replace(base, workers=n)  # noqa: E731
    path, batches, whys = [start], [], []
    lost_batches: list[tuple[int, int]] = []  # (pool, batches) spent before each change
    remade = 0  # prefetched batches dropped by the changes
    undone = None
    n, walk, now, visited = start, policy.State(), 0.0, [start]
    spent = warm = warmup_batches(n, prefetch)  # pool n's batches, its unjudged ones first
    for _ in range(MAX_WINDOWS):
        w = next_window(rates, at(n), prefetch, walk)
        now += w.wall_s + (warm / w.rate if w.rate > 0 else 0.0)
        spent, warm = spent + w.batches, 0
        budget = budget_at(rates, at(n), node_cores=node_cores, ranks=r, others=others)
        d, walk = policy.step(walk, w, budget, now=now, tune_workers=True, tune_prefetch=False)
        if d is None:
            if walk.shrink_votes:  # a shrink waits for its second window
                continue
            break
        if undoes(d):  # the window judging the change to n: it did not pay
            path.pop()
            batches.pop()
            undone = ("grow" if d.why == GROW_UNDONE else "shrink", n, n)
        elif d.workers in path:
            # the rule would go back to a count it left: it alternates between the two
            # (its budget moves with the rate); priced at the slower of them
            slower = min((n, d.workers), key=lambda k: predict(rates, at(k)).samples_per_s)
            undone = ("alternates", min(n, d.workers), max(n, d.workers))
            whys.append(d.why)
            if slower != n:
                lost_batches.append((n, spent))
                batches.append(spent)
                remade += n * prefetch
                n = slower
                path.append(n)
                visited.append(n)
            break
        else:
            path.append(d.workers)
            batches.append(spent)
            whys.append(d.why)
        lost_batches.append((n, spent))
        remade += n * prefetch
        n = d.workers
        visited.append(n)
        spent = warm = warmup_batches(n, prefetch)
    final = predict(rates, at(n))
    rate = max(final.samples_per_s, 1e-9)
    b = base.batch_size
    lost = sum(
        k * b * (1.0 / max(predict(rates, at(m)).samples_per_s, 1e-9) - 1.0 / rate)
        for m, k in lost_batches
    )
    lost += remade * b / rate  # the dropped prefetched batches are made again
    return Settling(path, batches, n, final, max(0.0, lost), undone, whys, visited)


def next_window(rates: Rates, config: Config, prefetch: int, walk: policy.State) -> Window:
    """The window the tuner would close next on ``config``'s pool (its length: the walk's
    for the loop's wait there)."""
    w = window_at(rates, config, prefetch=prefetch, seconds=walk.window_s(0.0))
    seconds = walk.window_s(w.wait)
    if seconds == walk.window_s(0.0):
        return w
    return window_at(rates, config, prefetch=prefetch, seconds=seconds)


def price(s: Settling, horizon_s: float) -> float:
    """Samples/s over a run of ``horizon_s`` seconds at the settled rate, with the settling's
    time lost in it (a longer job pays the same settling over more batches)."""
    rate = s.prediction.samples_per_s
    if rate <= 0 or horizon_s <= 0:
        return rate
    return rate * horizon_s / (horizon_s + s.lost_s)


def fragile(
    base: Config,
    rates: Rates,
    best: Config,
    *,
    oversubscription: dict[str, Any] | None,
    node_cores: int,
    ranks: int,
    others: float,
) -> list[dict[str, Any]]:
    """Why a fixed ``num_workers`` is fragile on this job, each a reason (``why``) and its
    figures (empty: it is not)."""
    out: list[dict[str, Any]] = []
    over = oversubscription or {}
    if over.get("oversubscribed") or base.workers > node_cores:
        share = over.get("worker_runq_share")
        out.append(
            {"why": "oversubscribed", "workers": base.workers, "cores": node_cores, "runq": share}
        )
    if ranks > 1:
        out.append({"why": "ranks", "ranks": ranks})
    if others > 0:
        out.append({"why": "others", "cores": round(others, 1)})
    if best.workers != base.workers and best.workers == int(rates.cores):
        out.append({"why": "all_cores", "workers": best.workers})
    return out


def auto_row(
    job: Job,
    rec: dict[str, Any],
    *,
    horizon_s: float,
    node_cores: int,
    prefetch: int = 2,
    ranks: int = 1,
    others: float = 0.0,
    oversubscription: dict[str, Any] | None = None,
) -> Option:
    """The ``"auto"`` row: its price against the best fixed setting ``rec`` (the search's
    recommendation), whether its rule recommends it (``eligible``; ``why``: the verdict's
    key), and the config that applies it.

    ``horizon_s``: the run the price is over, in seconds (the measured window's length:
    what ``--verify`` measures); the settled rate is given beside it."""
    rates, base, measured = job.rates, job.base, job.measured
    kwargs: dict[str, Any] = {"num_workers": AUTO}
    if rec["kwargs"].get("cache"):
        kwargs["cache"] = rec["kwargs"]["cache"]
    first = {"config": {"kwargs": kwargs}, "start": policy.start_workers(node_cores)}
    if "prep" in job.unknown:
        reason = job.unknown["prep"]
        return option("auto", measured, unpriced="unknown", eligible=False, reason=reason, **first)
    cache = float(rec["kwargs"].get("cache") or 0.0)
    at = replace(base, cache=cache)
    best = replace(at, workers=int(rec["kwargs"]["num_workers"]))
    fixed = predict(rates, best).samples_per_s
    # model against model (the job as it is, the best fixed setting); never below the
    # job as measured, as for any recommendation
    current = predict(rates, base).samples_per_s
    reasons = fragile(
        base,
        rates,
        best,
        oversubscription=oversubscription,
        node_cores=node_cores,
        ranks=ranks,
        others=others,
    )
    s = settle(rates, at, node_cores=node_cores, prefetch=prefetch, ranks=ranks, others=others)
    predicted = price(s, horizon_s)
    close = predicted >= (1 - MARGIN) * max(fixed, current)
    recommended = bool(reasons) and close and round(predicted, 1) >= round(measured, 1)
    why = (
        "fragile"
        if recommended
        else "not_fragile"
        if not reasons
        else "below_fixed"
        if not close
        else "below_job"
    )
    return option(
        "auto",
        measured,
        predicted,
        eligible=recommended,
        why=why,
        fragile=reasons,
        settles_on=s.settled,
        settled_samples_per_s=round(s.prediction.samples_per_s, 1),
        settling={
            "path": s.path,
            "batches": s.batches,
            "seconds_lost": round(s.lost_s, 3),
            "priced_over_s": round(horizon_s, 2),
            **({"undone": list(s.undone)} if s.undone else {}),
        },
        best_fixed={"kwargs": dict(rec["kwargs"]), "predicted_samples_per_s": round(fixed, 1)},
        bound=s.prediction.bound,
        **first,
    )
