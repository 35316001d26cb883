"""``unstall analyze -- python train.py``: the unchanged script, run once per mode.

Each run goes under unstall as ``unstall run`` does (the DataLoader swapped in
every Python process), with ``$UNSTALL_ANALYZE_MODE`` telling the in-process
agent (`unstall.analysis.agent`) what to measure and when to stop the script.
Every loader is watched; the one that carries the training loop is measured in
its steady state (`unstall.analysis.steady`), by time and steps, never on the
start-up burst. The rates come from the OS's clocks (`unstall.analysis.scriptrates`).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

from unstall.analysis.core import Analysis
from unstall.analysis.hang import run_script
from unstall.analysis.procstat import cores_available
from unstall.analysis.runs import Run
from unstall.analysis.scriptrates import derive, figures

#: Seconds one run of the script may take before it is stopped.
RUN_TIMEOUT_S = 600
#: (warm-up steps after the burst, least steps, least seconds, most seconds) per run.
WINDOW = (10, 50, 20.0, 240.0)
QUICK_WINDOW = (3, 12, 4.0, 60.0)
#: Lines of the script's output shown when a run fails.
TAIL = 12


def analyze_script(
    command: Sequence[str],
    *,
    steps: int | None = None,
    warmup: int | None = None,
    quick: bool = False,
    what_if: str | None = None,
    html_dir: str | None = None,
    console: Any = None,
    min_s: float | None = None,
    verify: bool | None = None,
    run_timeout_s: float = RUN_TIMEOUT_S,
) -> dict[str, Any]:
    """Run ``command`` three times (synthetic, cold, cached) and return the report dict.

    Without ``quick`` (or with ``verify=True``) the script runs a fourth time under the
    recommendation, and the report's ``verified`` compares prediction and measurement.
    A run still going after ``run_timeout_s`` is stopped whole, and the error says where
    each of its processes was (`unstall.analysis.hang`).
    """
    from unstall.analysis import report_of
    from unstall.analysis.report import progress_bar

    w0, s0, t0, tmax = QUICK_WINDOW if quick else WINDOW
    window = {
        "warmup": w0 if warmup is None else warmup,
        "steps": s0 if steps is None else steps,
        "min_s": t0 if min_s is None else min_s,
        "max_s": tmax,
        "timeout_s": run_timeout_s,
    }
    verify = (not quick) if verify is None else verify
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise FileNotFoundError(f"command not found: {command[0]!r}")
    docs: dict[str, dict[str, Any]] = {}
    per_rank: dict[str, list[dict[str, Any]]] = {}
    with progress_bar(console) as bar:
        task = bar.add_task("runs", total=3 + int(verify))
        for mode in ("synthetic", "cold", "cached"):
            if mode == "cached" and quick and not any(d.get("evicted") for d in per_rank["cold"]):
                # nothing could be evicted: the cold run already read what the page cache
                # held, and a script's prep/fetch split comes from the workers' clocks
                per_rank[mode] = [{**d, "mode": "cached", "reused": True} for d in per_rank["cold"]]
                bar.update(task, advance=1)
                continue
            bar.update(task, description=f"{mode} run: {' '.join(command)}")
            per_rank[mode] = run_once(command, mode, window)
            bar.update(task, advance=1)
        ranks = _rank_table(per_rank["cold"])
        slowest = ranks[0]["rank"]  # the analysis follows the slowest rank
        for mode, found in per_rank.items():
            docs[mode] = next((d for d in found if d["rank"] == slowest), found[0])
        analysis = analysis_of(command, docs, window)
        report = report_of(analysis, what_if=what_if, html_dir=html_dir)
        if verify:
            bar.update(task, description="verifying the recommendation")
            report["verified"] = verify_recommendation(command, report, window)
            bar.update(task, advance=1)
    report["ranks"] = ranks
    report["slowest_rank"] = slowest
    if html_dir is not None and verify:
        from unstall.analysis.html import rewrite_page

        rewrite_page(html_dir, report)
    return report


def run_once(
    command: Sequence[str],
    mode: str,
    window: dict[str, Any],
    *,
    config_path: str | None = None,
) -> list[dict[str, Any]]:
    """Run the script once in ``mode``; each rank's document (one process per rank)."""
    from unstall.launch.command import run_env

    out = tempfile.mkdtemp(prefix="unstall-analyze-")
    env = run_env(root_pid=os.getpid(), config_path=config_path)
    env.update(
        UNSTALL_BOOT_HOOKS="unstall.analysis.agent:install",  # the agent joins each process
        UNSTALL_ANALYZE_MODE=mode,
        UNSTALL_ANALYZE_OUT=out,
        UNSTALL_ANALYZE_WARMUP=str(window["warmup"]),
        UNSTALL_ANALYZE_STEPS=str(window["steps"]),
        UNSTALL_ANALYZE_MIN_S=str(window["min_s"]),
        UNSTALL_ANALYZE_MAX_S=str(window["max_s"]),
        UNSTALL_TIMELINE="1",
    )
    try:
        done = run_script(command, env, window.get("timeout_s", RUN_TIMEOUT_S), out, mode)
        return _results(out, mode, done)
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(env["UNSTALL_RUN_DIR"], ignore_errors=True)


def analysis_of(
    command: Sequence[str], docs: dict[str, dict[str, Any]], window: dict[str, Any]
) -> Analysis:
    """Rates, stall shares and the bottleneck from the three runs' documents."""
    for mode, doc in docs.items():
        if len(doc["steps"]) < 2:
            raise ValueError(_too_short(mode, doc))
    runs = {mode: _run_of(mode, doc) for mode, doc in docs.items()}
    figs = {mode: figures(doc) for mode, doc in docs.items()}
    cold = docs["cold"]
    workers = int(cold["num_workers"] or 0)
    batch = int(cold["batch_size"] or 0) or max(1, round(figs["cold"].samples / figs["cold"].steps))
    cores = cores_available()
    d = derive(figs, cores=cores, workers=workers)
    notes = [
        f"each run measured {window['steps']}+ steps and {window['min_s']:g}+ s of steady state "
        f"after each iterator's start-up burst ({docs['cold']['burst']} batches: "
        f"{workers} workers x prefetch {cold.get('prefetch_factor') or 2}) and "
        f"{window['warmup']} warm-up steps (dataset {cold['dataset']})",
        "per sample, each worker's time is split by the OS's clocks into CPU (prepare), "
        "waiting for a core, and the rest (waiting on I/O: fetch)",
    ]
    if docs["cached"].get("reused"):
        notes.append(
            "--quick: no separate cached run (the dataset names no files to evict, so the "
            "cold run read what the page cache held): the cold run stands for both"
        )
    for mode, doc in docs.items():
        if not doc.get("complete", True):
            notes.append(
                f"the {mode} run ended (or ran out of time) before its window was as long "
                "as asked: figures from "
                f"{len(doc['steps'])} steady steps"
            )
    notes += d.notes
    if d.oversubscribed["oversubscribed"]:
        share = d.oversubscribed["worker_runq_share"]
        notes.append(
            f"oversubscribed: {workers} workers on {cores} cores"
            + (f"; workers waited for a core {share:.0%} of their time" if share else "")
        )
    if d.cores_used_by_others:
        notes.append(
            f"other processes used {d.cores_used_by_others:.1f} of {cores} cores during "
            "the measurement: the what-if prices the cores left"
        )
    loaders = cold.get("loaders", [])
    return Analysis(
        workload=" ".join(command),
        runs=runs,
        rates=d.rates,
        probe=None,
        num_workers=workers,
        batch_size=batch,
        num_samples=int(cold["stats"].get("samples", 0)) or figs["cold"].samples,
        split=False,
        cached_how="the script again right after the cold run (the page cache holds what it read)",
        stall=d.stall,
        bottleneck=d.bottleneck,
        fetch_rate=d.fetch_rate if d.fetch_rate is not None else 0.0,
        notes=notes,
        unknown=d.unknown,
        measured=d.measured,
        shared=d.cores_used_by_others > 0,
        extra={
            "loaders": loaders,
            "measured_loader": cold.get("loader", 0),
            "oversubscription": d.oversubscribed,
            "lean_probe": cold.get("lean_probe"),
            "pin_memory": cold.get("pin_memory", False),
            "window": {m: figs[m].steps for m in figs},
            "ingestion_rate_alone": round(d.ingestion_alone, 2),
        },
    )


def verify_recommendation(
    command: Sequence[str], report: dict[str, Any], window: dict[str, Any]
) -> dict[str, Any]:
    """Run the script once more under the recommendation (``unstall run --config``'s way).

    A re-run slower than the job was (beyond ``SPREAD``) is followed by one of the job as it
    is, back to back: the verdict then compares the two, so a machine that slowed down
    between the runs is not taken for a wrong recommendation, nor the reverse.
    """
    rec = report["recommendation"]
    before = report["measured_samples_per_s"]
    measured = _rate_under(command, window, rec["kwargs"])
    control = None
    if rec["changed"] and measured < (1 - SPREAD) * before:
        control = _rate_under(command, window, None)
    predicted = rec["predicted_samples_per_s"]
    return {
        "kwargs": rec["kwargs"],
        "changed": rec["changed"],
        "predicted_samples_per_s": predicted,
        "measured_samples_per_s": measured,
        "before_samples_per_s": before,
        **({"control_samples_per_s": control} if control is not None else {}),
        "error": round(abs(predicted - measured) / measured, 4) if measured else None,
        "verdict": _verdict(rec["changed"], measured, before, control),
    }


#: Run-to-run spread of one configuration that the verdict takes for noise.
SPREAD = 0.08


def _rate_under(command: Sequence[str], window: dict[str, Any], kwargs: Any) -> float:
    """Samples/s of one cold run, under ``kwargs`` (``None``: the job's own settings)."""
    path = None
    if kwargs is not None:
        fd, path = tempfile.mkstemp(prefix="unstall-rec-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"kwargs": kwargs}, f)
    try:
        docs = run_once(command, "cold", window, config_path=path)
    finally:
        if path is not None:
            os.unlink(path)
    return round(figures(docs[0]).rate, 1)


def _verdict(changed: bool, measured: float, before: float, control: float | None) -> str:
    """One line on what the re-run shows, against the run it is fairly compared with."""
    if not changed:
        diff = (measured - before) / before if before else 0.0
        return (
            "the recommendation keeps the job's settings: this re-run of them shows the "
            f"machine's run-to-run spread ({diff:+.0%})"
        )
    ref, against = before, "the job as it was"
    if control:
        ref, against = control, "the job as it is, re-run just after"
    diff = (measured - ref) / ref if ref else 0.0
    if diff >= SPREAD:
        return f"{diff:.0%} faster than {against}"
    if diff >= -SPREAD:
        return f"within the run-to-run spread of {against} ({diff:+.0%})"
    return f"{-diff:.0%} slower than {against}: the recommendation did not hold here"


def _too_short(mode: str, doc: dict[str, Any]) -> str:
    return (
        f"the {mode} run was too short to measure: its loader handed out {doc['batches']} "
        f"batches, of which the first {doc['skipped']} were the start-up burst and warm-up "
        "(a figure from them would be the burst's, not the job's); run more batches "
        "(a larger dataset or more epochs) or lower --warmup"
    )


def _results(out: str, mode: str, done: subprocess.CompletedProcess) -> list[dict[str, Any]]:
    """Each rank's figures for ``mode`` (one process per rank under torchrun)."""
    found = sorted(glob.glob(os.path.join(out, f"{mode}-*.json")))
    if not found:
        tail = (done.stdout or "").strip().splitlines()[-TAIL:]
        raise ValueError(
            f"the {mode} run made no unstall-swapped DataLoader batches (exit {done.returncode})"
            + ("; the script's last output:\n  " + "\n  ".join(tail) if tail else "")
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
