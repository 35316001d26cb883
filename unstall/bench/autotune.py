"""`bench autotune`: ``num_workers="auto"`` against the best fixed setting of a sweep, same run.

Five jobs, each run with every fixed ``num_workers`` from 1 to 2x the cores and with
``"auto"``, the rate taken over the whole run (worker start-up and settling included):

* ``prep_bound``: CPU-heavy samples, no model time; the user asked 8 workers x prefetch 4
  (the start-up burst shape), shown beside the sweep;
* ``compute_bound``: cheap samples, a simulated accelerator that takes longer than one
  worker needs; the CPU goal: auto's CPU seconds over those of the fewest workers that
  keep the rate (within 5 % of the best);
* ``fetch_bound_s3``: raw bytes from SeaweedFS behind a 20 ms proxy; the sweep also fixes
  the requests in flight per worker (`S3_INFLIGHT`, named ``"<workers>w_<n>inflight"``),
  the plain counts keep the store's own choice (latency x target rate);
* ``cost_doubles``: the per-sample CPU doubles half way through the epoch;
* ``two_ranks``: two processes of one job on this node (``LOCAL_WORLD_SIZE=2``), each
  prep-bound; the rate is both together, and the most workers they held at once is kept.

Goals: each job's rate >= `GOAL_RATIO` x the best fixed one; compute-bound CPU <=
`GOAL_CPU` x. Each job's ``ratio`` and ``cpu_ratio`` are in the JSON.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import resource
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data

from unstall.bench.harness import BenchResult, frozen_heap, measure

DESCRIPTION = "num_workers='auto' vs the best fixed num_workers of a sweep (1..2x cores)"
GOAL_RATIO = 0.92
GOAL_CPU = 1.15
#: A fixed setting "keeps the rate" within this share of the best one.
KEEPS = 0.95
#: Every job's size is multiplied by this (tests run a tenth).
SCALE = 1.0
#: (workers, requests in flight per worker) the S3 sweep adds to the plain worker counts.
S3_INFLIGHT = ((1, 128), (2, 16), (2, 128))
#: Runs of each setting (median taken); None: 3 with --quick, 5 without.
REPEATS: int | None = None
_repeats = 3


class Spin(torch.utils.data.Dataset):
    """Sample i costs ``cost_s`` of CPU (``2 x`` from sample ``double_from`` on)."""

    def __init__(self, n: int, cost_s: float, double_from: int | None = None):
        self.n, self.cost_s, self.double_from = n, cost_s, double_from

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        cost = self.cost_s * (2 if self.double_from is not None and i >= self.double_from else 1)
        end, x = time.thread_time() + cost, 0
        while time.thread_time() < end:
            x += 1
        return torch.full((16,), i, dtype=torch.int64)


def _cpu_s() -> float:
    """CPU seconds of this process and its reaped children (the loaders' workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _once(make: Callable[[], Any], rate: float | None) -> dict[str, Any]:
    """One run of a loader over its whole epoch: rate, CPU, and what auto did."""
    gc.collect()
    c0 = _cpu_s()
    loader = make()
    m = measure(loader, rate=rate)
    auto = loader.stats().get("autotune")
    loader.close()
    del loader
    gc.collect()
    out: dict[str, Any] = {
        "samples_per_s": round(m.samples_per_s, 1),
        "wall_s": round(m.wall_s, 3),
        "stall": round(m.stall_fraction, 3),
        "cpu_s": round(_cpu_s() - c0, 3),
        "samples": m.samples,
    }
    if auto is not None:
        out["settled_on"] = auto["num_workers"]
        out["prefetch_factor"] = auto["prefetch_factor"]
        if auto.get("max_inflight") is not None:  # requests in flight per worker, where tuned
            out["max_inflight"] = auto["max_inflight"]
        out["changes"] = auto["changes"]
        out["restart_s"] = auto["restart_s"]
        out["history"] = auto["history"]
    return out


def _compare(name: str, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """A job's figures: auto against the best fixed setting, CPU against the fewest that keep
    the rate."""
    fixed = {k: v for k, v in runs.items() if _workers_of(k) is not None}
    best_key = max(fixed, key=lambda k: fixed[k]["samples_per_s"])
    best = fixed[best_key]["samples_per_s"]
    keeping = [k for k, v in fixed.items() if v["samples_per_s"] >= KEEPS * best]
    keeps = min(keeping, key=lambda k: (_workers_of(k), fixed[k]["cpu_s"]))
    auto = runs["auto"]
    return {
        "job": name,
        "ratio": round(auto["samples_per_s"] / max(best, 1e-9), 3),
        "cpu_ratio": round(auto["cpu_s"] / max(fixed[keeps]["cpu_s"], 1e-9), 3),
        "best_fixed": int(best_key) if best_key.isdigit() else best_key,
        "fewest_keeping_rate": int(keeps) if keeps.isdigit() else keeps,
        "runs": runs,
    }


def _workers_of(key: str) -> int | None:
    """The workers of a fixed setting's key (``"3"``, ``"2w_128inflight"``); None otherwise."""
    head = key.split("w_")[0] if key.endswith("inflight") else key
    return int(head) if head.isdigit() else None


def _sweep(make: Callable[[int | str, int | None], Any], rate: float | None, top: int,
           asked: tuple[int, int] | None = None,
           inflight: tuple[tuple[int, int], ...] = ()) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Every setting `_repeats` times, interleaved (a loaded machine's drift hits all
    alike); the run with each setting's median rate. ``inflight``: (workers, requests in
    flight) settings too (``make`` then takes a third argument)."""
    settings: dict[str, tuple[Any, ...]] = {str(n): (n, None) for n in range(1, top + 1)}
    if asked is not None:
        settings[f"asked_{asked[0]}x{asked[1]}"] = asked
    for workers, n in inflight:
        settings[f"{workers}w_{n}inflight"] = (workers, None, n)
    settings["auto"] = ("auto", None)
    return _repeated(settings, lambda s: _once(lambda: make(*s), rate))


def _repeated(settings: dict[str, Any], once: Callable[[Any], dict[str, Any]]) -> dict[str, Any]:
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in settings}
    order = list(settings)
    for r in range(_repeats):  # every other round backwards: no setting always runs last
        for key in order if r % 2 == 0 else order[::-1]:
            runs[key].append(once(settings[key]))
    out = {}
    for key, each in runs.items():  # the median rate's run; CPU: the median of all
        cpu = sorted(r["cpu_s"] for r in each)
        each.sort(key=lambda r: r["samples_per_s"])
        out[key] = {
            **each[len(each) // 2],
            "cpu_s": cpu[len(cpu) // 2],
            "all_samples_per_s": [r["samples_per_s"] for r in each],
            "all_cpu_s": [r["cpu_s"] for r in each],
        }
    return out


def _spin_loader(n: int, cost_s: float, batch: int, double_from: int | None = None):
    import unstall

    def make(workers: int | str, prefetch: int | None) -> Any:
        return unstall.DataLoader(
            Spin(n, cost_s, double_from),
            batch_size=batch,
            seed=0,
            num_workers=workers,
            prefetch_factor=prefetch,
        )

    return make


def _rank_child(cfg: dict[str, Any], go: Any, send: Any) -> None:
    os.environ.update(cfg["env"])
    make = _spin_loader(cfg["n"], cfg["cost_s"], cfg["batch"])
    go.wait(60)
    loader = make(cfg["workers"], None)
    t0 = time.perf_counter()
    it = iter(loader)
    held = []
    samples = 0
    for batch in it:
        samples += len(batch)
        held.append((time.perf_counter(), loader.num_workers))
    t1 = time.perf_counter()
    auto = loader.stats().get("autotune")
    del it
    loader.close()
    send.send({"t0": t0, "t1": t1, "samples": samples, "held": held, "auto": auto})


def _two_ranks(workers: int | str, n: int, cost_s: float, batch: int) -> dict[str, Any]:
    """Two ranks of one job at once (forked), each ``workers``; their rate together."""
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    go = ctx.Event()
    env = {"UNSTALL_AUTOTUNE_JOB": f"bench-{uuid.uuid4().hex}", "LOCAL_WORLD_SIZE": "2"}
    cfg = {"env": env, "n": n, "cost_s": cost_s, "batch": batch, "workers": workers}
    c0 = _cpu_s()
    procs = [ctx.Process(target=_rank_child, args=(cfg, go, send)) for _ in range(2)]
    for p in procs:
        p.start()
    send.close()
    go.set()
    outs = [recv.recv() for _ in procs]
    for p in procs:
        p.join(timeout=30)
    wall = max(o["t1"] for o in outs) - min(o["t0"] for o in outs)
    samples = sum(o["samples"] for o in outs)
    events = sorted((t, i, w) for i, o in enumerate(outs) for t, w in o["held"])
    now, most = {}, 0
    for _, i, w in events:  # the most workers both ranks held at one moment
        now[i] = w
        most = max(most, sum(now.values()))
    out = {
        "samples_per_s": round(samples / wall, 1),
        "wall_s": round(wall, 3),
        "cpu_s": round(_cpu_s() - c0, 3),
        "samples": samples,
        "most_workers_together": most,
    }
    if workers == "auto":
        out["settled_on"] = [o["auto"]["num_workers"] for o in outs]
        out["history"] = [o["auto"]["history"] for o in outs]
    return out


def _s3_job(n: int, top: int, say: Callable[..., Any]) -> dict[str, dict[str, Any]] | None:
    from unstall.bench.s3 import raw_collate
    from unstall.bench.s3_rig import BUCKET, ProxyProcess
    from unstall.testing import SeaweedServer
    from unstall.testing.seaweed import find_weed

    if find_weed() is None:
        say("fetch_bound_s3: no `weed` binary: skipped")
        return None
    import unstall
    from unstall.stores.s3 import S3Store

    with SeaweedServer([BUCKET]) as server:
        keys = [f"train/{i:05d}.bin" for i in range(n)]
        up = S3Store(f"s3://{BUCKET}", **server.store_options())
        blob = os.urandom(16 * 1024)
        for i in range(0, n, 256):
            up.put_many([(k, blob) for k in keys[i : i + 256]])
        up.close()
        with ProxyProcess(server.endpoint, 0.020) as endpoint:
            opts = server.store_options(endpoint=endpoint)

            def make(workers: int | str, prefetch: int | None, inflight: int | None = None) -> Any:
                store = S3Store(f"s3://{BUCKET}", **opts, max_inflight=inflight)
                ds = unstall.FileDataset(store, keys)
                return unstall.DataLoader(
                    ds, batch_size=32, seed=0, cache=False, collate_fn=raw_collate,
                    num_workers=workers, prefetch_factor=prefetch,
                )  # fmt: skip

            return _sweep(make, None, top, inflight=S3_INFLIGHT)


def run(*, quick: bool, console: Any = None) -> BenchResult:
    with frozen_heap():  # each run ends in a full collection: only the runs' objects walked
        return _run(quick=quick, console=console)


def _run(*, quick: bool, console: Any) -> BenchResult:
    from unstall.loader.autotune.resources import node_cores

    say = console.print if console is not None else print
    cores = node_cores()
    top = 2 * cores
    global _repeats
    scale = (1 if quick else 4) * SCALE
    _repeats = REPEATS or (3 if quick else 5)
    jobs: dict[str, dict[str, Any]] = {}

    # prep-bound: 1 ms of CPU a sample, no model time; the user asked 8 x prefetch 4
    make = _spin_loader(int(6144 * scale), 0.001, 16)
    jobs["prep_bound"] = _compare("prep_bound", _sweep(make, None, top, asked=(8, 4)))
    say(_line(jobs["prep_bound"]))
    # compute-bound: 0.25 ms a sample; the model takes 4x what one worker needs
    make = _spin_loader(int(2048 * scale), 0.00025, 32)
    jobs["compute_bound"] = _compare("compute_bound", _sweep(make, 1000.0, top))
    say(_line(jobs["compute_bound"]))
    s3 = _s3_job(int(8192 * scale), top, say)
    if s3 is not None:
        jobs["fetch_bound_s3"] = _compare("fetch_bound_s3", s3)
        say(_line(jobs["fetch_bound_s3"]))
    # the per-sample cost doubles half way: one worker keeps up, then two are needed
    n = int(6144 * scale)
    make = _spin_loader(n, 0.0004, 16, double_from=n // 2)
    jobs["cost_doubles"] = _compare("cost_doubles", _sweep(make, 1600.0, top))
    say(_line(jobs["cost_doubles"]))
    settings = {str(w): w for w in range(1, top + 1)} | {"auto": "auto"}
    ranks = _repeated(settings, lambda w: _two_ranks(w, int(3072 * scale), 0.001, 16))
    jobs["two_ranks"] = _compare("two_ranks", ranks)
    jobs["two_ranks"]["most_workers_together"] = ranks["auto"]["most_workers_together"]
    say(_line(jobs["two_ranks"]))
    return _result(jobs, cores, quick=quick)


def _line(job: dict[str, Any]) -> str:
    auto = job["runs"]["auto"]
    inflight = f" x {auto['max_inflight']} in flight" if "max_inflight" in auto else ""
    return (
        f"{job['job']:15} auto {auto['samples_per_s']:8.1f}/s (settled on "
        f"{auto.get('settled_on')}{inflight}) vs best fixed {job['best_fixed']}: ratio "
        f"{job['ratio']:.3f}, CPU {job['cpu_ratio']:.2f}x the fewest keeping the rate "
        f"({job['fewest_keeping_rate']})"
    )


def _result(jobs: dict[str, dict[str, Any]], cores: int, *, quick: bool) -> BenchResult:
    rows = []
    for name, job in jobs.items():
        for setting, r in job["runs"].items():
            rows.append(
                {
                    "case": name,
                    "loader": setting,
                    "samples_per_s": r["samples_per_s"],
                    "cpu_s": r["cpu_s"],
                    "settled_on": r.get("settled_on"),
                    "ratio": job["ratio"] if setting == "auto" else None,
                }
            )
    worst = min(jobs.values(), key=lambda j: j["ratio"])
    compute = jobs["compute_bound"]
    met = {
        "ratio": all(j["ratio"] >= GOAL_RATIO for j in jobs.values()),
        "compute_cpu": compute["cpu_ratio"] <= GOAL_CPU,
        "two_ranks_within_cores": jobs["two_ranks"]["most_workers_together"] <= cores,
    }
    summary = {
        name: {
            "ratio": j["ratio"],
            "cpu_ratio": j["cpu_ratio"],
            "best_fixed": j["best_fixed"],
            "settled_on": j["runs"]["auto"].get("settled_on"),
            **(
                {"settled_inflight": j["runs"]["auto"]["max_inflight"]}
                if "max_inflight" in j["runs"]["auto"]
                else {}
            ),
        }
        for name, j in jobs.items()
    }
    best = worst["runs"][str(worst["best_fixed"])]
    return BenchResult(
        name="autotune",
        ratio=worst["ratio"],
        baseline={"job": worst["job"], "best_fixed": worst["best_fixed"], **_brief(best)},
        unstall={"job": worst["job"], **_brief(worst["runs"]["auto"])},
        rows=rows,
        detail={
            "quick": quick,
            "cores": cores,
            "goals": {"ratio_min": GOAL_RATIO, "compute_cpu_max": GOAL_CPU},
            "met": met,
            "jobs_summary": summary,
            "jobs": jobs,
        },
        notes=[
            "ratio: auto's rate over the whole run / the best fixed num_workers (sweep 1.."
            f"{2 * cores}); headline: the worst job. cpu_ratio: auto's CPU s / those of the "
            "fewest workers keeping 95 % of the best rate.",
            "figures from a machine shared with other jobs (loaded machine): rates vary",
            f"goals met: {met}",
        ],
    )


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    return {k: r[k] for k in ("samples_per_s", "cpu_s", "wall_s") if k in r}
