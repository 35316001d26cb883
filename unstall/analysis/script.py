"""``unstall analyze -- python train.py``: the unchanged script, run once per mode.

Each run goes under unstall as ``unstall run`` does (the DataLoader swapped in
every Python process), with ``$UNSTALL_ANALYZE_MODE`` telling the in-process
agent (`unstall.analysis.agent`) what to measure and when to stop the script.
The script's dataset is usually a plain ``__getitem__`` that opens and decodes: a
worker's time per sample is then split into its CPU time (prepare) and the
rest (waiting on I/O: fetch), and the report says so.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from unstall.analysis.core import (
    Analysis,
    bottleneck_of,
    derive_rates,
    split_by_worker_time,
    stall_shares,
)
from unstall.analysis.model import Config, predict
from unstall.analysis.runs import Run

#: Seconds one run of the script may take before it is stopped.
RUN_TIMEOUT_S = 600


def analyze_script(
    command: Sequence[str],
    *,
    steps: int | None = None,
    warmup: int | None = None,
    quick: bool = False,
    what_if: str | None = None,
    html_dir: str | None = None,
    console: Any = None,
) -> dict[str, Any]:
    """Run ``command`` three times (synthetic, cold, cached) and return the report dict."""
    from unstall.analysis import QUICK_STEPS, STEPS, report_of
    from unstall.analysis.report import progress_bar
    from unstall.launch.command import run_env

    w0, s0 = QUICK_STEPS if quick else STEPS
    warmup, steps = (w0 if warmup is None else warmup), (s0 if steps is None else steps)
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise FileNotFoundError(f"command not found: {command[0]!r}")
    out = tempfile.mkdtemp(prefix="unstall-analyze-")
    runs: dict[str, Run] = {}
    docs: dict[str, dict[str, Any]] = {}
    per_rank: dict[str, list[dict[str, Any]]] = {}
    try:
        with progress_bar(console) as bar:
            task = bar.add_task("runs", total=3)
            for mode in ("synthetic", "cold", "cached"):
                bar.update(task, description=f"{mode} run: {' '.join(command)}")
                env = run_env(root_pid=os.getpid())
                env.update(
                    UNSTALL_ANALYZE_MODE=mode,
                    UNSTALL_ANALYZE_OUT=out,
                    UNSTALL_ANALYZE_WARMUP=str(warmup),
                    UNSTALL_ANALYZE_STEPS=str(steps),
                    UNSTALL_TIMELINE="1",
                )
                try:
                    done = subprocess.run(
                        list(command),
                        env=env,
                        timeout=RUN_TIMEOUT_S,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.PIPE,
                        text=True,
                    )
                finally:
                    shutil.rmtree(env["UNSTALL_RUN_DIR"], ignore_errors=True)
                per_rank[mode] = _results(out, mode, done)
                bar.update(task, advance=1)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    ranks = _rank_table(per_rank["cold"])
    slowest = ranks[0]["rank"]  # the analysis follows the slowest rank
    for mode, found in per_rank.items():
        docs[mode] = next((d for d in found if d["rank"] == slowest), found[0])
        runs[mode] = _run_of(mode, docs[mode])
    cold = docs["cold"]
    workers = int(cold["num_workers"] or 0)
    batch = int(cold["batch_size"] or 1)
    rates, fetch_rate = derive_rates(
        SimpleNamespace(num_workers=workers, batch_size=batch), runs, None
    )
    stall = split_by_worker_time(stall_shares(runs), rates)
    prep_rate = predict(rates, Config(workers, batch)).caps["prep"]
    analysis = Analysis(
        workload=" ".join(command),
        runs=runs,
        rates=rates,
        probe=None,
        num_workers=workers,
        batch_size=batch,
        num_samples=int(cold["stats"].get("samples", 0)) or batch * len(cold["steps"]),
        split=False,
        cached_how="the script again right after the cold run (the page cache holds what it read)",
        stall=stall,
        bottleneck=bottleneck_of(stall, prep_rate, fetch_rate),
        fetch_rate=fetch_rate,
        notes=[
            f"the script ran 3 times, each stopped after {warmup} warm-up + {steps} steps "
            f"(dataset {cold['dataset']}); "
            "per sample, each worker's CPU time counts as prepare, the rest as fetch"
        ],
    )
    report = report_of(analysis, what_if=what_if, html_dir=html_dir)
    report["ranks"] = ranks
    report["slowest_rank"] = slowest
    return report


def _results(out: str, mode: str, done: subprocess.CompletedProcess) -> list[dict[str, Any]]:
    """Each rank's figures for ``mode`` (one process per rank under torchrun)."""
    found = sorted(glob.glob(os.path.join(out, f"{mode}-*.json")))
    if not found:
        tail = (done.stderr or "").strip().splitlines()[-8:]
        raise ValueError(
            f"the {mode} run made no unstall-swapped DataLoader batches (exit {done.returncode})"
            + ("; its last output:\n  " + "\n  ".join(tail) if tail else "")
        )
    docs = []
    for path in found:
        with open(path) as f:
            docs.append(json.load(f))
    return docs


def _rank_table(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rank of the cold run: samples/s and the share of time it waited; slowest first."""
    rows = []
    for doc in docs:
        steps = doc["steps"]
        wall = sum(s[0] + s[1] for s in steps)
        rows.append(
            {
                "rank": int(doc["rank"]),
                "samples_per_s": round(sum(s[2] for s in steps) / wall, 2) if wall else 0.0,
                "wait_share": round(sum(s[0] for s in steps) / wall, 4) if wall else 0.0,
            }
        )
    return sorted(rows, key=lambda r: (r["samples_per_s"], r["rank"]))


def _run_of(mode: str, doc: dict[str, Any]) -> Run:
    steps = doc["steps"]
    if not steps:
        raise ValueError(f"the {mode} run handed out too few batches to time a step")
    wait = sum(s[0] for s in steps)
    compute = sum(s[1] for s in steps)
    run = Run(
        mode,
        sum(s[2] for s in steps),
        wait + compute,
        wait,
        compute,
        len(steps),
        doc["start"],
        step_s=[s[0] + s[1] for s in steps],
        compute_steps=[s[1] for s in steps],
    )
    run.spans = [tuple(s) for s in doc["timeline"]]
    run.stats = doc["stats"]
    return run
