"""The report as data (``--json``) and as a terminal summary (rich tables)."""

from __future__ import annotations

import math
import platform
from typing import Any

from unstall.analysis.core import Analysis
from unstall.analysis.model import Config, parse_what_if, predict
from unstall.analysis.recommend import curves, grid, recommend, row
from unstall.analysis.remedies import remedies


def sentence(a: Analysis) -> str:
    """The bottleneck in one plain sentence, from the measured rates."""
    s = a.stall
    g = a.rates.ingestion
    measured = a.measured_rate
    if a.bottleneck == "compute":
        return (
            f"Compute-bound: the model is busy {s['compute']:.0%} of the time "
            f"({measured:,.0f} of its {g:,.0f} samples/s); faster data loading would not "
            "speed this job up."
        )
    if a.bottleneck == "prep":
        p = a.prep_rate
        cap = f"{p:,.0f} samples/s" if p is not None else "a rate not measured"
        return (
            f"Prep-bound: the model waits {s['prep']:.0%} of the time for workers to decode and "
            f"augment ({cap} from {a.num_workers} workers on {a.rates.cores:g} cores; "
            f"{measured:,.0f}/s delivered, {g:,.0f}/s needed)."
        )
    f = f"{a.fetch_rate:,.0f} samples/s fetched" if "fetch" not in a.unknown else "fetch rate"
    return (
        f"Fetch-bound: the model waits {s['fetch']:.0%} of the time for storage "
        f"({f}; {measured:,.0f}/s delivered, {g:,.0f}/s needed)."
    )


def build_report(a: Analysis, *, what_if: str | None = None) -> dict[str, Any]:
    """Everything the outputs show, JSON-safe: a rate not measured is None, with its reason."""
    base = a.base_config
    measured = a.measured_rate
    prep = a.prep_rate
    per_worker = a.prep_rate_per_worker
    out: dict[str, Any] = {
        "workload": a.workload,
        "ingestion_rate": round(a.rates.ingestion, 2),
        "prep_rate": round(prep, 2) if prep is not None else None,
        "prep_rate_per_worker": round(per_worker, 2) if per_worker is not None else None,
        "fetch_rate": round(a.fetch_rate, 2)
        if "fetch" not in a.unknown and math.isfinite(a.fetch_rate)
        else None,
        "fetch_rate_measured": round(a.runs["fetch"].samples_per_s, 2)
        if "fetch" in a.runs
        else None,
        "not_measured": dict(a.unknown),
        "stall": a.stall,
        "bottleneck": a.bottleneck,
        "summary": sentence(a),
        "measured_samples_per_s": round(measured, 2),
        "num_workers": a.num_workers,
        "batch_size": a.batch_size,
        "num_samples": a.num_samples,
        "cores": a.rates.cores,
        "runs": {k: r.summary() for k, r in a.runs.items()},
        "rates": a.rates.as_dict(),
        "storage": a.probe.as_dict() if a.probe is not None else None,
        "cached_run": {"how": a.cached_how, "hit_rate": a.cached_hit_rate},
        "split": (
            "fetch and prepare timed apart (the dataset has fetch/prepare)"
            if a.split
            else "per sample, worker CPU time = prepare, waiting for a core = oversubscription, "
            "the rest = fetch (waiting on I/O)"
        ),
        "model_check": _model_check(a, base),
        "what_if": grid(a.rates, base, a.num_samples) if "prep" not in a.unknown else [],
        "curves": curves(a.rates, base, a.num_samples, a.fetch_rate or measured),
        "recommendation": recommend(
            a.rates,
            base,
            a.num_samples,
            measured,
            unknown=a.unknown,
            shared=a.shared,
        ),
        "remedies": remedies(
            a.rates,
            base,
            bottleneck=a.bottleneck,
            measured=measured,
            probe=a.extra.get("lean_probe"),
            unknown=a.unknown,
        ),
        "notes": a.notes,
        "machine": {"cores": a.rates.cores, "python": platform.python_version()},
        **{k: v for k, v in a.extra.items() if k not in ("files", "lean_probe")},
    }
    if what_if:
        config = parse_what_if(what_if, base)
        out["question"] = row(a.rates, config, a.num_samples, asked=what_if)
    return out


def _measured_fetch(a: Analysis) -> float | None:
    """The fetch-only run's samples/s (None for a plain dataset: it has no such run)."""
    return round(a.runs["fetch"].samples_per_s, 2) if "fetch" in a.runs else None


def _model_check(a: Analysis, base: Config) -> dict[str, Any]:
    """The model's prediction for the measured configuration next to the cold run."""
    predicted = predict(a.rates, base).samples_per_s
    measured = a.measured_rate
    return {
        "predicted_samples_per_s": round(predicted, 1),
        "measured_samples_per_s": round(measured, 1),
        "error": round(abs(predicted - measured) / measured, 4) if measured else None,
    }


def progress_bar(console: Any = None) -> Any:
    """The bar `unstall analyze` shows over its runs (both modes): step, done/total, time."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def print_summary(report: dict[str, Any], console: Any = None) -> None:
    """Rich tables: the three rates, stall shares, the bottleneck sentence, the recommendation."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    rates = Table(title=f"unstall analyze: {report['workload']}")
    rates.add_column("rate")
    rates.add_column("samples/s", justify="right")
    rates.add_column("measured by")
    rates.add_row("G (model)", f"{report['ingestion_rate']:,.0f}", "synthetic run: one batch again")
    nm = report.get("not_measured", {})
    per = report["prep_rate_per_worker"]
    rates.add_row(
        f"P (prep, {report['num_workers']} workers, {report['cores']:.1f} cores)",
        _rate(report["prep_rate"], nm.get("prep")),
        f"{per:,.0f}/s per worker (CPU time per sample)" if per else "",
    )
    rates.add_row("F (fetch)", _rate(report["fetch_rate"], nm.get("fetch")), _fetch_how(report))
    rates.add_row(
        "measured", f"{report['measured_samples_per_s']:,.0f}", "the job as it is (steady state)"
    )
    console.print(rates)
    stall = Table(title="where the cold run's time went")
    for col in ("compute", "prep stall", "fetch stall"):
        stall.add_column(col, justify="right")
    s = report["stall"]
    stall.add_row(f"{s['compute']:.0%}", f"{s['prep']:.0%}", f"{s['fetch']:.0%}")
    console.print(stall)
    console.print(f"[bold]{report['summary']}[/bold]")
    if report["what_if"]:
        console.print(_grid_table(report["what_if"]))
    rec = report["recommendation"]
    if rec.get("changed", True):
        console.print(
            f"Recommendation: DataLoader({_kwargs(rec['kwargs'])}): predicted "
            f"{rec['predicted_samples_per_s']:,.0f} samples/s, {rec['predicted_speedup']}x the "
            f"{rec['predicted_current_samples_per_s']:,.0f}/s predicted as it is "
            f"(measured {rec['measured_samples_per_s']:,.0f}/s)"
        )
    else:
        console.print(f"Recommendation: keep the loader as it is: {rec['why_unchanged']}")
    for r in report.get("remedies", []):
        gain = (
            f"predicted {r['predicted_samples_per_s']:,.0f} samples/s ({r['predicted_speedup']}x)"
            if r["predicted_samples_per_s"] is not None
            else r.get("not_measured", "not measured")
        )
        console.print(escape(f"  remedy [{r['remedy']}]: {r['what']}: {gain}"))
    if len(report.get("loaders") or []) > 1:
        console.print(_loaders_table(report["loaders"]))
    v = report.get("verified")
    if v:
        console.print(
            f"Verified: under {_kwargs(v['kwargs'])} the script measured "
            f"{v['measured_samples_per_s']:,.0f} samples/s (predicted "
            f"{v['predicted_samples_per_s']:,.0f}; before {v['before_samples_per_s']:,.0f}"
            + (
                f"; as it is, re-run {v['control_samples_per_s']:,.0f}"
                if "control_samples_per_s" in v
                else ""
            )
            + f"): {v['verdict']}"
        )
    if "question" in report:
        q = report["question"]
        console.print(
            f"What if {q['asked']}: {q['samples_per_s']:,.0f} samples/s, epoch "
            f"{q['epoch_s']:,.1f} s ({q['bound']}-bound)"
        )
    if len(report.get("ranks") or []) > 1:
        per = ", ".join(
            f"rank {r['rank']} {r['samples_per_s']:,.0f}/s (waits {r['wait_share']:.0%})"
            for r in sorted(report["ranks"], key=lambda r: r["rank"])
        )
        console.print(f"Ranks: {per}; slowest: rank {report['slowest_rank']} (analysed above)")
    for note in report["notes"]:
        console.print(f"  note: {note}")


def _rate(value: float | None, why: str | None) -> str:
    return f"{value:,.0f}" if value is not None else f"not measured ({why or 'unknown'})"


def _loaders_table(rows: list[dict[str, Any]]) -> Any:
    """Every loader the script made: the measured one carries the training loop."""
    from rich.table import Table

    table = Table(title="loaders of the script (cold run)")
    for col in ("#", "dataset", "batches", "samples", "waited", ""):
        table.add_column(col)
    for r in rows:
        share = r.get("wait_share")
        table.add_row(
            str(r["index"]),
            r["dataset"],
            str(r["batches"]),
            str(r["samples"]),
            f"{share:.0%}" if share is not None else "-",
            "measured: carries the training loop" if r["measured"] else "",
        )
    return table


def _grid_table(rows: list[dict[str, Any]]) -> Any:
    """The what-if grid as workers (rows) x cache fraction (columns), predicted samples/s."""
    from rich.table import Table

    caches = sorted({r["cache"] for r in rows})
    table = Table(title="what if: predicted samples/s (workers x cache / dataset)")
    table.add_column("workers", justify="right")
    for c in caches:
        table.add_column(f"cache {c:g}", justify="right")
    for w in sorted({r["workers"] for r in rows}):
        cells = {r["cache"]: r for r in rows if r["workers"] == w}
        table.add_row(str(w), *(f"{cells[c]['samples_per_s']:,.0f}" for c in caches))
    return table


def _fetch_how(report: dict[str, Any]) -> str:
    st = report.get("storage")
    if not st:
        return "workers' time per sample minus their CPU time"
    from unstall.analysis.probe import UNLIMITED

    bandwidth = st["bandwidth_bytes_per_s"]
    limit = "no bandwidth limit seen" if bandwidth >= UNLIMITED else f"{bandwidth / 1e6:,.1f} MB/s"
    return f"fetch-only run; storage: {limit}, {st['latency_ms']:.1f} ms/request"


def _kwargs(kwargs: dict[str, Any]) -> str:
    parts = []
    for k, v in kwargs.items():
        parts.append(f"cache=unstall.Cache({v})" if k == "cache" else f"{k}={v!r}")
    return ", ".join(parts)
