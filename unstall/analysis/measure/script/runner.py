"""``unstall analyze -- python train.py``: the unchanged script, run once per mode.

Each run goes under unstall as ``unstall run`` does (the DataLoader swapped in
every Python process), with ``$UNSTALL_ANALYZE_MODE`` telling the in-process
agent (`unstall.analysis.measure.script.agent`) what to measure and when to stop the
script. Every loader is watched; the one that carries the training loop is measured in
its steady state (`unstall.analysis.measure.steady`), by time and steps, never on the
start-up burst. The runs' documents, the slowest rank's, make the `Measurement`; the
rates come from them in the rates stage (`unstall.analysis.rates.script`).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from unstall.analysis.measure.machine import read_machine
from unstall.analysis.measure.result import Measurement, Run
from unstall.analysis.measure.script.hang import run_script
from unstall.analysis.measure.steady import LEAST_KEPT

#: Seconds one run of the script may take before it is stopped.
RUN_TIMEOUT_S = 600
#: (warm-up steps after the burst, least steps, least seconds, most seconds) per run.
WINDOW = (10, 50, 20.0, 240.0)
QUICK_WINDOW = (3, 12, 4.0, 60.0)
#: The model-alone window's least seconds, as a share of the others' (the agent's rule).
SYNTHETIC_SHARE = 0.5
#: Lines of the script's output shown when a run fails.
TAIL = 12


def window_of(
    *,
    quick: bool,
    warmup: int | None,
    steps: int | None,
    min_s: float | None,
    timeout_s: float,
) -> dict[str, Any]:
    """Each run's window: warm-up and least steps after the burst, least and most seconds."""
    w0, s0, t0, tmax = QUICK_WINDOW if quick else WINDOW
    return {
        "warmup": w0 if warmup is None else warmup,
        "steps": s0 if steps is None else steps,
        "min_s": t0 if min_s is None else min_s,
        "max_s": tmax,
        "timeout_s": timeout_s,
    }


def measure_script(
    command: Sequence[str],
    window: dict[str, Any],
    *,
    quick: bool = False,
    progress: Callable[[str | None], None] | None = None,
) -> Measurement:
    """Run ``command`` cold then synthetic (one run: the model alone once the cold window is
    written), and cached; the slowest rank's runs as a `Measurement`.

    ``progress``: told each run's description before it, and None after it.
    """
    say = progress or (lambda _msg: None)
    if shutil.which(command[0]) is None and not os.path.exists(command[0]):
        raise FileNotFoundError(f"command not found: {command[0]!r}")
    say(f"cold run, then the model alone: {' '.join(command)}")
    found = run_modes(command, ("cold", "synthetic"), window)
    say(None)
    cold, synthetic = found["cold"], found["synthetic"]
    if not _whole(synthetic, cold):  # the script ended first: the model alone in a run of its own
        say(f"synthetic run: {' '.join(command)}")
        synthetic = run_once(command, "synthetic", window)
        say(None)
    per_rank = {"synthetic": synthetic, "cold": cold}
    reused = _cold_stands_for_cached(cold) if quick else ""
    if reused:
        per_rank["cached"] = [{**d, "mode": "cached", "reused": reused} for d in cold]
    else:
        say(f"cached run: {' '.join(command)}")
        per_rank["cached"] = run_once(command, "cached", window)
        say(None)
    ranks = rank_table(per_rank["cold"])
    slowest = ranks[0]["rank"]  # the analysis follows the slowest rank
    docs = {
        mode: next((d for d in found if d["rank"] == slowest), found[0])
        for mode, found in per_rank.items()
    }
    return measurement_of(command, docs, window, ranks)


def _cold_stands_for_cached(cold: list[dict[str, Any]]) -> str:
    """Why ``--quick`` needs no separate cached run after ``cold`` (each rank's document), or
    "" when it does. A script's prep/fetch split comes from its workers' clocks, so the
    cached run (the page cache warm) is only their stand-in where the cold run could not time
    its workers (num_workers=0, an iterable dataset on torch's own iterator)."""
    if not any(d.get("evicted") for d in cold):
        return "the dataset names no files to evict, so the cold run read what the page cache held"
    if all(_workers_timed(d) for d in cold):
        return "the workers' own clocks split the cold run's time into prepare and fetch"
    return ""


def _workers_timed(doc: dict[str, Any]) -> bool:
    """Whether a run's document times its workers per sample: a map-style loader's batch
    spans (their CPU in field 6, samples in field 7), or an iterable dataset's workers read
    from /proc over the window (the two sources `unstall.analysis.rates.script` reads)."""
    if any(len(s) >= 8 and s[7] for s in doc.get("timeline", [])):
        return True
    return bool(doc.get("passthrough")) and doc.get("workers_cpu_s", 0.0) > 0


def _whole(synthetic: list[dict[str, Any]], cold: list[dict[str, Any]]) -> bool:
    """Whether every rank of the cold run timed the model alone to a whole window after it."""
    by_rank = {int(d["rank"]): d for d in synthetic}
    return all(
        (d := by_rank.get(int(c["rank"]))) is not None and d["complete"] and len(d["steps"]) >= 2
        for c in cold
    )


def run_once(
    command: Sequence[str],
    mode: str,
    window: dict[str, Any],
    *,
    config_path: str | None = None,
) -> list[dict[str, Any]]:
    """Run the script once in ``mode``; each rank's document (one process per rank)."""
    return run_modes(command, (mode,), window, config_path=config_path)[mode]


def run_modes(
    command: Sequence[str],
    modes: tuple[str, ...],
    window: dict[str, Any],
    *,
    config_path: str | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Run the script once, measuring ``modes[0]`` then (``modes[1]``, when given) the next in
    the same processes; each mode's documents, one per rank (none for a second mode the script
    ended before). The agent goes on to one mode at most."""
    if len(modes) > 2:
        raise ValueError(f"one run measures two modes at most, not {modes}")
    from unstall.launch.command import run_env

    out = tempfile.mkdtemp(prefix="unstall-analyze-")
    env = run_env(root_pid=os.getpid(), config_path=config_path)
    env.update(
        # the agent joins each process
        UNSTALL_BOOT_HOOKS="unstall.analysis.measure.script.agent:install",
        UNSTALL_ANALYZE_MODE=modes[0],
        UNSTALL_ANALYZE_THEN=modes[1] if len(modes) > 1 else "",
        UNSTALL_ANALYZE_OUT=out,
        UNSTALL_ANALYZE_WARMUP=str(window["warmup"]),
        UNSTALL_ANALYZE_STEPS=str(window["steps"]),
        UNSTALL_ANALYZE_MIN_S=str(window["min_s"]),
        UNSTALL_ANALYZE_MAX_S=str(window["max_s"]),
        UNSTALL_TIMELINE="1",
    )
    try:
        done = run_script(command, env, window.get("timeout_s", RUN_TIMEOUT_S), out, modes[0])
        found = {modes[0]: _results(out, modes[0], done)}
        for mode in modes[1:]:
            found[mode] = _docs(out, mode)
        return found
    finally:
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(env["UNSTALL_RUN_DIR"], ignore_errors=True)


def measurement_of(
    command: Sequence[str],
    docs: dict[str, dict[str, Any]],
    window: dict[str, Any],
    ranks: list[dict[str, Any]],
) -> Measurement:
    """The three runs' documents (one rank's) as a `Measurement`, with how they were taken."""
    for mode, doc in docs.items():
        if len(doc["steps"]) < 2:
            raise ValueError(_too_short(mode, doc))
    runs = {mode: run_of(mode, doc) for mode, doc in docs.items()}
    cold = docs["cold"]
    workers = int(cold["num_workers"] or 0)
    c = runs["cold"]
    batch = int(cold["batch_size"] or 0) or max(1, round(c.samples / c.steps))
    notes = [
        f"each run measured {window['steps']}+ steps and {window['min_s']:g}+ s of steady state "
        f"(the model alone: {window['min_s'] * SYNTHETIC_SHARE:g}+ s) "
        f"after each iterator's start-up burst ({cold['burst']} batches: "
        f"{workers} workers x prefetch {cold.get('prefetch_factor') or 2}) and "
        f"{window['warmup']} warm-up steps (dataset {cold['dataset']})",
        "per sample, each worker's time is split by the OS's clocks into CPU (prepare), "
        "waiting for a core, and the rest (waiting on I/O: fetch)",
    ]
    if docs["synthetic"].get("after") == "cold":
        notes.append(
            "the model alone (G) was timed in the cold run's own processes once its window "
            "was written: the running epoch's batches, and each epoch's after it, were the "
            "loader's last real batch again (no second start of the script)"
        )
    else:
        notes.append(
            "the model alone (G) was timed in a run of its own: the script ended before a "
            "whole window of it after the cold one's (too few batches for both)"
        )
    if docs["cached"].get("reused"):
        notes.append(
            f"--quick: no separate cached run ({docs['cached']['reused']}): the cold run "
            "stands for both"
        )
    short = short_epochs(cold)
    if short:
        notes.append(short)
    for mode, doc in docs.items():
        if not doc.get("complete", True):
            notes.append(
                f"the {mode} run ended (or ran out of time) before its window was as long "
                "as asked: figures from "
                f"{len(doc['steps'])} steady steps"
            )
    machine = read_machine(cuda=cold.get("cuda"))
    return Measurement(
        workload=" ".join(command),
        mode="script",
        runs=runs,
        probe=None,
        num_workers=workers,
        batch_size=batch,
        num_samples=int(cold["stats"].get("samples", 0)) or c.samples,
        machine=machine,
        split=False,
        cached_how="the script again right after the cold run (the page cache holds what it read)",
        notes=notes,
        docs=docs,
        ranks=ranks,
        extra={
            "loaders": cold.get("loaders", []),
            "measured_loader": cold.get("loader", 0),
            "lean_probe": cold.get("lean_probe"),
            "detection_probe": cold.get("detection_probe"),
            "gpu_probe": _gpu_probe(machine, cold.get("files") or []),
            "file_cache": cold.get("file_cache"),
            "sample_cache": cold.get("sample_cache"),
            "wire": docs["synthetic"].get("wire"),
            "pin_memory": cold.get("pin_memory", False),
            "window": {mode: len(doc["steps"]) for mode, doc in docs.items()},
        },
    )


def short_epochs(doc: dict[str, Any]) -> str | None:
    """Why a run over short epochs took long to measure, or None: each iterator's start-up
    burst is never timed, so where the bursts were half or more of what the loader handed
    out, the window was gathered over that many epochs (the figures hold; the wait has a cause)."""
    batches, skipped = int(doc.get("batches") or 0), int(doc.get("skipped") or 0)
    iterators = int(doc.get("iterators") or 0)
    if iterators < 2 or not batches or 2 * skipped < batches:
        return None
    return (
        f"short epochs: the measured loader handed out {batches} batches over {iterators} "
        f"iterators (about {batches / iterators:.0f} an epoch) and {skipped} of them, each "
        f"iterator's start-up burst of {_burst_each(doc)} and the warm-up, are never timed; "
        f"the window was gathered over {iterators} epochs (longer ones measure sooner)"
    )


def _burst_each(doc: dict[str, Any]) -> int:
    """Batches each iterator after the first left untimed: its burst, 0 after a switch (the
    agent's ``skip_each``; a document older than it: the burst)."""
    return int(doc.get("skip_each", doc.get("burst")) or 0)


def _too_short(mode: str, doc: dict[str, Any]) -> str:
    batches, iterators = int(doc["batches"]), int(doc.get("iterators") or 0)
    each = _burst_each(doc)
    if iterators >= 2 and each and batches / iterators < each + LEAST_KEPT:
        return (  # no epoch is longer than its burst: more of them cannot help
            f"the {mode} run was too short to measure: its loader handed out {batches} "
            f"batches in {iterators} epochs of about {batches / iterators:.0f}, and each "
            f"epoch's first {each} (its workers' start-up burst) are never timed, so an "
            f"epoch gives steady steps only from {each + LEAST_KEPT} batches on: more epochs will "
            "not help; measure with more batches an epoch (a larger dataset or a smaller "
            "batch size) or fewer workers"
        )
    return (
        f"the {mode} run was too short to measure: its loader handed out {batches} "
        f"batches, of which the first {doc['skipped']} were the start-up burst and warm-up "
        "(a figure from them would be the burst's, not the job's); run more batches "
        "(a larger dataset or more epochs) or lower --warmup"
    )


def _results(out: str, mode: str, done: subprocess.CompletedProcess) -> list[dict[str, Any]]:
    """Each rank's figures for ``mode`` (one process per rank under torchrun)."""
    found = _docs(out, mode)
    if not found:
        tail = (done.stdout or "").strip().splitlines()[-TAIL:]
        raise ValueError(
            f"the {mode} run made no unstall-swapped DataLoader batches (exit {done.returncode})"
            + ("; the script's last output:\n  " + "\n  ".join(tail) if tail else "")
        )
    return found


def _docs(out: str, mode: str) -> list[dict[str, Any]]:
    """The documents the run's processes wrote for ``mode``, one per rank."""
    docs = []
    for path in sorted(glob.glob(os.path.join(out, f"{mode}-*.json"))):
        with open(path) as f:
            docs.append(json.load(f))
    return docs


def rank_table(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def run_of(mode: str, doc: dict[str, Any]) -> Run:
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


def _gpu_probe(machine: Any, files: list[str]) -> dict[str, Any] | None:
    """The GPU stage timed on the job's files, on a machine with CUDA and a GPU decoder, after
    the job's runs (nothing else on the GPU); None elsewhere (issue 47)."""
    if not (machine.cuda and machine.gpu_decoder and files):
        return None
    from unstall.gpu import gpu_prep_rate

    return gpu_prep_rate(files)
