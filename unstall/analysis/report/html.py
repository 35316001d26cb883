"""The HTML report: tables and PNG plots (matplotlib) in one folder, opened by any browser.

Plots: the time breakdown of each run (compute, prep stall, fetch stall), what-if
curves (throughput against cache size, workers and bandwidth), and a few seconds
of the cold run's timeline (one lane per worker, one for the training loop).
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from typing import Any

from unstall.analysis.report.loaders import COLUMNS, cells, saved_line, verified_lines
from unstall.analysis.report.pages import remedies_html
from unstall.analysis.report.terminal import auto_text, remote_text, verified_workers_text
from unstall.analysis.report.timeline import LOOP, lane_order, lanes, write_trace
from unstall.analysis.report.words import recommendation_lines

COLORS = {
    "compute": "#4c72b0",
    "prep": "#dd8452",
    "prepare": "#dd8452",
    "fetch": "#c44e52",
    "wait": "#8172b3",  # the loop waiting: not the same colour as a worker fetching
}
TITLES = {
    "breakdown": "Time breakdown per 1,000 samples",
    "whatif": "What if: predicted samples/s",
    "timeline": "Timeline of the cold run",
}


def write_report(out_dir: str, report: dict[str, Any], spans: Sequence[tuple[float, ...]]) -> str:
    """Write ``index.html``, its PNGs, ``trace.json`` and ``report.json``; returns the HTML path."""
    os.makedirs(out_dir, exist_ok=True)
    import matplotlib

    matplotlib.use("Agg", force=True)
    page = _page(report)
    _breakdown(os.path.join(out_dir, "breakdown.png"), report)
    _whatif(os.path.join(out_dir, "whatif.png"), report)
    _timeline(os.path.join(out_dir, "timeline.png"), spans)
    write_trace(os.path.join(out_dir, "trace.json"), spans)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    path = os.path.join(out_dir, "index.html")
    with open(path, "w") as f:
        f.write(page)
    return path


def _breakdown(path: str, report: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    runs, s = report["runs"], report.get("stall_shown") or report["stall"]
    gpu = 1000 * runs["synthetic"]["wall_s"] / max(1, runs["synthetic"]["samples"])
    cold = 1000 * runs["cold"]["wall_s"] / max(1, runs["cold"]["samples"])
    compute, prep, fetch = (cold * s[k] for k in ("compute", "prep", "fetch"))
    names = ["synthetic (G)", "cached", "cold (as it is)"]
    parts = {
        "compute": [gpu, compute, compute],
        "prep stall": [0, prep, prep],
        "fetch stall": [0, 0, fetch],
    }
    fig, ax = plt.subplots(figsize=(8, 2.8), dpi=100)
    left = [0.0, 0.0, 0.0]
    for (label, values), color in zip(parts.items(), ("compute", "prep", "fetch"), strict=True):
        shown = label if any(values) else "_nolegend_"  # a part no bar has: not in the legend
        ax.barh(names, values, left=left, color=COLORS[color], label=shown)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.invert_yaxis()
    ax.set_xlim(0, max(left) * 1.05)  # the longest bar ends inside the axes
    ax.set_xlabel("seconds per 1,000 samples")
    ax.set_title(TITLES["breakdown"])
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)  # beside, not on, the bars
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


#: The what-if panels, by curve: their titles and x labels.
PANELS = {
    "cache": ("vs cache size", "cache / dataset"),
    "workers": ("vs workers", "workers"),
    "bandwidth": ("vs bandwidth", "storage bandwidth (x measured)"),
}
#: A curve that moves less than this share of its top over its whole range is flat: drawn at
#: the plot's size it shows nothing (a line along the top), and is said in words instead.
FLAT = 0.02


def flat_curves(curves: dict[str, Any]) -> dict[str, str]:
    """The what-if curves not drawn, each with the sentence the page says instead: flat ones
    (`FLAT`), and the bandwidth where it was not measured."""
    out = {}
    for name, (title, _) in PANELS.items():
        c = curves.get(name) or {}
        ys = [y for k in ("y", "unstall", "page_cache") for y in c.get(k) or []]
        if name == "bandwidth" and not c.get("x"):
            out[name] = f"{title}: not measured, the dataset reads its own files"
        elif ys and max(ys) - min(ys) <= FLAT * max(ys):
            low, high = f"{min(ys):,.0f}", f"{max(ys):,.0f}"
            rate = high if low == high else f"{low}-{high}"
            out[name] = (
                f"{title}: not drawn, {rate} samples/s over its whole range ({name} does not "
                "change this job's rate)"
            )
    return out


def _whatif(path: str, report: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    c = report["curves"]
    names = [n for n in PANELS if n not in flat_curves(c)]
    if not names:
        return
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.4), dpi=100, squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        if name == "cache":
            ax.plot(c["cache"]["x"], c["cache"]["unstall"], color="#4c72b0", label="unstall.Cache")
            ax.plot(c["cache"]["x"], c["cache"]["page_cache"], color="#999999",
                    label="page cache (LRU)")  # fmt: skip
            ax.legend(fontsize=8)
        else:
            color = "#55a868" if name == "workers" else "#c44e52"
            ax.plot(c[name]["x"], c[name]["y"], marker="o", color=color)
        title, xlabel = PANELS[name]
        ax.set_xlabel(xlabel)
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("samples/s")
        ax.set_ylim(bottom=0)
        ax.axhline(report["ingestion_rate"], color="#4c72b0", lw=0.8, ls="--")
    fig.suptitle(TITLES["whatif"])
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _timeline(path: str, spans: Sequence[tuple[float, ...]]) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    data = lanes(spans, seconds=3.0)
    names = sorted({LOOP, *data}, key=lane_order)
    fig, ax = plt.subplots(figsize=(12, 0.6 * len(names) + 1.2), dpi=100)
    for y, name in enumerate(names):
        for kind in ("compute", "wait", "fetch", "prepare"):
            bars = [(a, b - a) for k, a, b in data.get(name, []) if k == kind]
            if bars:
                ax.broken_barh(bars, (y - 0.35, 0.7), color=COLORS[kind])
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.set_title(TITLES["timeline"])
    ax.legend(
        handles=[Patch(color=COLORS[k], label=k) for k in ("compute", "wait", "fetch", "prepare")],
        loc="upper right",
        fontsize=8,
        ncol=4,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _rate(report: dict[str, Any], key: str, name: str) -> str:
    value = report.get(key)
    if value is None:
        why = html.escape(report.get("not_measured", {}).get(name, "unknown"))
        return f'<span class="unknown" title="{why}">not measured ({why})</span>'
    return f"{value:,.0f}/s"


def _recommendation(report: dict[str, Any]) -> str:
    e = html.escape
    rec = report["recommendation"]
    lines = recommendation_lines(rec)
    text = f"<p class='recommendation'>{e(lines[0].removeprefix('Recommendation: '))}</p>"
    by_config = rec.get("changed", True) and not rec.get("edit")
    # a loader setting is applied by the file written beside this page: one "Apply it" line
    # that names it, in place of the terminal's "apply it: ... FILE holding ..."
    rest = [line for line in lines[1:] if not (by_config and line.startswith("  apply it:"))]
    text += "".join(f"<p>{e(_sentence(line))}</p>" for line in rest)
    if by_config:
        text += (
            "<p>Apply it: <code>unstall run --config recommendation.json -- python train.py"
            "</code> (recommendation.json, written beside this page, holds the setting above; "
            "no edit of the script)</p>"
        )
    text += remedies_html()
    items = []
    for r in report.get("remedies", []):
        if r["remedy"] == "auto":
            state = "recommended" if r.get("recommended") else "priced"
            text += (
                f"<h3>The loader sizing its own pool</h3><table class='auto'><tr><th>setting"
                "</th><th>samples/s</th><th></th></tr>"
                f"<tr data-remedy='auto' data-state='{state}'>"
                f"<td><code>{e(json.dumps(r['config']['kwargs']))}</code></td>"
                f"<td>{_price(r)}</td><td style='text-align:left'>{e(auto_text(r))}</td></tr>"
                "</table>"
            )
            continue
        gain = (
            f"predicted {r['predicted_samples_per_s']:,.0f} samples/s ({r['predicted_speedup']}x)"
            if r.get("predicted_samples_per_s") is not None
            else e(r.get("not_measured") or r.get("not_applicable") or "not measured")
        )
        more = (
            f"<br><small>{e(remote_text(r))}</small>"
            if r.get("config") and (r["remedy"] == "remote")
            else ""
        )
        items.append(f"<li><b>{e(r['remedy'])}</b>: {e(r['what'])}: {gain}{more}</li>")
    if items:
        text += "<h3>Remedies that change the pipeline</h3><ul>" + "".join(items) + "</ul>"
    v = report.get("verified")
    if v and v.get("autotune"):
        t = v["autotune"]
        text += (
            "<p class='verified'>Under <code>num_workers='auto'</code> the re-run ran "
            f"{' -> '.join(str(n) for n in t['path'])} workers and settled on "
            f"{t['settled_on']}.</p>"
        )
    if v:
        text += (
            f"<p class='verified'>Verified: the script under {e(json.dumps(v['kwargs']))} "
            f"measured {v['measured_samples_per_s']:,.0f} samples/s (predicted "
            f"{v['predicted_samples_per_s']:,.0f}, before {v['before_samples_per_s']:,.0f}"
            + (
                f", as it is re-run {v['control_samples_per_s']:,.0f}"
                if "control_samples_per_s" in v
                else ""
            )
            + f"): {e(v['verdict'])}.</p>"
        )
        if v.get("workers"):
            text += f"<p class='verified'><small>{e(verified_workers_text(v))}</small></p>"
    return text


def _sentence(line: str) -> str:
    """A line of the terminal's as a sentence of its own (capitalized, unindented)."""
    line = line.strip()
    return line[:1].upper() + line[1:]


def _price(r: dict[str, Any]) -> str:
    value = r.get("predicted_samples_per_s")
    if value is None:
        return f'<span class="unknown">{html.escape(r.get("not_measured") or "not priced")}</span>'
    return f"{value:,.0f}"


def _loaders(report: dict[str, Any]) -> str:
    rows = report.get("loaders") or []
    if len(rows) < 2:
        return ""
    e = html.escape
    head = "".join(f"<th>{e(c)}</th>" for c in COLUMNS)
    body = "".join(
        f"<tr data-loader='{r['index']}'>" + "".join(f"<td>{e(c)}</td>" for c in cells(r)) + "</tr>"
        for r in rows
    )
    saved = saved_line(report["recommendation"]).strip()
    verified = verified_lines(report.get("verified") or {})
    more = "".join(f"<p>{e(line.strip())}</p>" for line in ([saved] if saved else []) + verified)
    return f"<h2>Loaders of the script</h2><table><tr>{head}</tr>{body}</table>{more}"


def _page(report: dict[str, Any]) -> str:
    e = html.escape
    s = report.get("stall_shown") or report["stall"]
    rows = "".join(
        f"<tr><td>{e(r['config'])}</td><td>{r['samples_per_s']:,.0f}</td>"
        f"<td>{r['epoch_s']:,.1f}</td><td>{e(r['bound'])}</td></tr>"
        for r in report["what_if"]
    )
    notes = "".join(f"<li>{e(n)}</li>" for n in [report["split"], *report["notes"]])
    flat = flat_curves(report["curves"])
    shown = [n for n in ("breakdown", "whatif", "timeline") if n != "whatif" or len(flat) < 3]
    figures = "".join(
        f'<h2>{e(TITLES[name])}</h2><img src="{name}.png" alt="{e(TITLES[name])}" '
        f'onload="this.dataset.ok=this.naturalWidth">'
        + (
            "".join(f"<p class='flat'>{e(t)}</p>" for t in flat.values())
            if name == "whatif"
            else ""
        )
        for name in shown
    )
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>unstall analyze: {e(report["workload"])}</title>
<style>body{{font-family:sans-serif;margin:24px;max-width:1250px}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}
.verdict{{font-size:1.2em;font-weight:bold}}img{{max-width:100%}}.unknown{{color:#888}}</style>
</head><body>
<h1>unstall analyze: {e(report["workload"])}</h1>
<p class="verdict">{e(report["summary"])}</p>
<table><tr><th>G (model)</th><th>P (prep, {report["num_workers"]} workers)</th>
<th>F (fetch)</th><th>measured</th></tr>
<tr><td>{report["ingestion_rate"]:,.0f}/s</td><td>{_rate(report, "prep_rate", "prep")}</td>
<td>{_rate(report, "fetch_rate", "fetch")}</td>
<td>{report["measured_samples_per_s"]:,.0f}/s</td></tr></table>
<p>Steady state: compute {s["compute"]:.0%}, prep stall {s["prep"]:.0%},
fetch stall {s["fetch"]:.0%}.</p>
<h2>Recommendation</h2>{_recommendation(report)}
{_loaders(report)}
{figures}
<h2>What-if table</h2><table><tr><th>configuration</th><th>samples/s</th><th>epoch (s)</th>
<th>bound</th></tr>{rows}</table>
<h2>How it was measured</h2><ul>{notes}</ul>
<p>Timeline for Perfetto / chrome://tracing: <a href="trace.json">trace.json</a></p>
</body></html>
"""
