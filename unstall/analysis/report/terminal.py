"""The report on the terminal: rich tables of the rates, the stall shares, the what-if grid,
the recommendation and the remedies; all read from the report dict (`build`)."""

from __future__ import annotations

import json
from typing import Any

from unstall.analysis.measure.probe import UNLIMITED
from unstall.analysis.report.loaders import COLUMNS, cells, saved_line, verified_lines
from unstall.analysis.report.pages import remedies_line
from unstall.analysis.report.words import kwargs_text, recommendation_lines


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
    s = report.get("stall_shown") or report["stall"]
    stall.add_row(f"{s['compute']:.0%}", f"{s['prep']:.0%}", f"{s['fetch']:.0%}")
    console.print(stall)
    console.print(f"[bold]{report['summary']}[/bold]")
    if report["what_if"]:
        console.print(_grid_table(report["what_if"]))
    for line in recommendation_lines(report["recommendation"]):
        console.print(escape(line))
    console.print(escape(remedies_line()))
    for r in report.get("remedies", []):
        if r["remedy"] == "auto":
            console.print(escape(f"  remedy [auto]: {auto_text(r)}"))
            continue
        gain = (
            f"predicted {r['predicted_samples_per_s']:,.0f} samples/s ({r['predicted_speedup']}x)"
            if r["predicted_samples_per_s"] is not None
            else r.get("not_measured") or r.get("not_applicable") or "not measured"
        )
        console.print(escape(f"  remedy [{r['remedy']}]: {r['what']}: {gain}"))
        if r["remedy"] == "remote" and r.get("config"):
            console.print(escape(f"    {remote_text(r)}"))
        if r["remedy"] == "detection" and r.get("worker_cpu_ms_per_sample"):
            cpu = r["worker_cpu_ms_per_sample"]
            console.print(
                escape(
                    f"    CPU per sample in a worker: {cpu['now']:g} ms as it is, "
                    f"{cpu['planned']:g} ms planned ({r['samples_timed']} of the job's samples "
                    f"timed side by side); config {json.dumps(r['config'])}"
                )
            )
    if len(report.get("loaders") or []) > 1:
        console.print(_loaders_table(report["loaders"]))
        if saved_line(report["recommendation"]):
            console.print(escape(saved_line(report["recommendation"])))
    v = report.get("verified")
    if v and v.get("autotune"):
        t = v["autotune"]
        path = " -> ".join(str(n) for n in t["path"])
        console.print(
            f"Verified: num_workers='auto' ran {path} workers, settled on {t['settled_on']}"
        )
    if v:
        console.print(
            f"Verified: under {kwargs_text(v['kwargs'])} the script measured "
            f"{v['measured_samples_per_s']:,.0f} samples/s (predicted "
            f"{v['predicted_samples_per_s']:,.0f}; before {v['before_samples_per_s']:,.0f}"
            + (
                f"; as it is, re-run {v['control_samples_per_s']:,.0f}"
                if "control_samples_per_s" in v
                else ""
            )
            + f"): {v['verdict']}"
        )
        if v.get("workers"):
            console.print(escape(f"  {verified_workers_text(v)}"))
        for line in verified_lines(v):
            console.print(escape(line))
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


def verified_workers_text(v: dict[str, Any]) -> str:
    """One line on what the verification's run spent per sample (`verified.workers`) and the
    cores other jobs held then: beside the price, whether a gap is a cost or the load."""
    w = v["workers"]
    parts = []
    if "cpu_ms_per_sample" in w:
        parts.append(
            f"workers {w['cpu_ms_per_sample']:g} ms CPU per sample, "
            f"{w['core_wait_ms_per_sample']:g} ms waiting for a core"
        )
    if "main_cpu_ms_per_sample" in w:
        receive = w.get("receive_ms_per_sample")
        of = f" (receiving batches {receive:g} ms)" if receive else ""
        parts.append(f"training process {w['main_cpu_ms_per_sample']:g} ms{of}")
    if "in_order_wait_share" in w:
        parts.append(
            f"batch times varying {w['batch_cv']:.0%}, the workers waiting "
            f"{w['in_order_wait_share']:.1%} of their time on the in-order delivery"
        )
    if "epoch_samples_per_s" in w:
        parts.append(
            f"whole epochs from the second {w['epoch_samples_per_s']:,.0f} samples/s (each from "
            "its iter(), the workers' start in it; the rates above are inside an epoch)"
        )
    load = (v.get("at_verify_load") or {}).get("cores_left_when_measured")
    then = f" (priced with {load:g} cores left to the job)" if load is not None else ""
    parts.append(f"other jobs held {w.get('other_cores', 0.0):g} cores{then}")
    return "the verification's run: " + "; ".join(parts)


def auto_text(r: dict[str, Any]) -> str:
    """The ``auto`` row in one line: its price, where it settles, the walk there, what it
    stands against, and whether it is recommended (and why)."""
    if r.get("predicted_samples_per_s") is None:
        return f"{r['what']}: {r.get('not_measured') or 'not priced'}"
    st, best = r["settling"], r["best_fixed"]
    walk = " -> ".join(str(n) for n in st["path"])
    verdict = "recommended" if r["recommended"] else "not recommended"
    return (
        f"DataLoader(num_workers='auto'): predicted {r['predicted_samples_per_s']:,.0f} "
        f"samples/s ({r['predicted_speedup']}x) over {st['priced_over_s']:g} s: settles on "
        f"{r['settles_on']} workers ({r['settled_samples_per_s']:,.0f}/s; walk {walk}, "
        f"{st['seconds_lost']:g} s lost settling"
        + (f"; {st['undone']}" if st.get("undone") else "")
        + f"); best fixed DataLoader({kwargs_text(best['kwargs'])}) "
        f"{best['predicted_samples_per_s']:,.0f}/s; {verdict}: {r['why']}"
    )


def _rate(value: float | None, why: str | None) -> str:
    return f"{value:,.0f}" if value is not None else f"not measured ({why or 'unknown'})"


def _loaders_table(rows: list[dict[str, Any]]) -> Any:
    """Every loader the script made: the measured one carries the training loop; each other
    one's pass, its price under the sample cache and what the config holds for it."""
    from rich.table import Table

    table = Table(title="loaders of the script (cold run)")
    for col in COLUMNS:
        table.add_column(col)
    for r in rows:
        table.add_row(*cells(r))
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
    bandwidth = st["bandwidth_bytes_per_s"]
    limit = "no bandwidth limit seen" if bandwidth >= UNLIMITED else f"{bandwidth / 1e6:,.1f} MB/s"
    return f"fetch-only run; storage: {limit}, {st['latency_ms']:.1f} ms/request"


def remote_text(r: dict[str, Any]) -> str:
    """The remote row's transfer, config and what it needs, in one line (issue 45)."""
    t = r["transfer"]
    if t.get("measured"):
        moved = (
            f"{t['bytes_per_sample']:,.0f} bytes/sample, received at "
            f"{t['receive_cpu_ms_per_sample']:g} ms CPU/sample, {t['network_mb_per_s']:,g} MB/s "
            "over the network"
        )
    else:
        moved = t["why"]
    return (
        f"{r['remote_workers']} x {r['per_worker_samples_per_s']:,.0f}/s beside the local "
        f"{r['local_samples_per_s']:,.0f}/s up to the {r['bound']} cap; {moved}; config "
        f"{json.dumps(r['config'])}; {r['applies']}; priced, not chosen: {r['why_not_recommended']}"
    )
