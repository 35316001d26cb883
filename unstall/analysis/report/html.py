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

from unstall.analysis.report.terminal import auto_text, remote_text
from unstall.analysis.report.timeline import LOOP, lane_order, lanes, write_trace

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
    _breakdown(os.path.join(out_dir, "breakdown.png"), report)
    _whatif(os.path.join(out_dir, "whatif.png"), report)
    _timeline(os.path.join(out_dir, "timeline.png"), spans)
    write_trace(os.path.join(out_dir, "trace.json"), spans)
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    path = os.path.join(out_dir, "index.html")
    with open(path, "w") as f:
        f.write(_page(report))
    return path


def _breakdown(path: str, report: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    runs, s = report["runs"], report["stall"]
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
        ax.barh(names, values, left=left, color=COLORS[color], label=label)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("seconds per 1,000 samples")
    ax.set_title(TITLES["breakdown"])
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _whatif(path: str, report: dict[str, Any]) -> None:
    import matplotlib.pyplot as plt

    c = report["curves"]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), dpi=100)
    ax = axes[0]
    ax.plot(c["cache"]["x"], c["cache"]["unstall"], color="#4c72b0", label="unstall.Cache")
    ax.plot(c["cache"]["x"], c["cache"]["page_cache"], color="#999999", label="page cache (LRU)")
    ax.set_xlabel("cache / dataset")
    ax.legend(fontsize=8)
    axes[1].plot(c["workers"]["x"], c["workers"]["y"], marker="o", color="#55a868")
    axes[1].set_xlabel("workers")
    if c["bandwidth"]["x"]:
        axes[2].plot(c["bandwidth"]["x"], c["bandwidth"]["y"], marker="o", color="#c44e52")
        axes[2].set_xlabel("storage bandwidth (x measured)")
    else:
        axes[2].text(
            0.5,
            0.5,
            "not measured:\nthe dataset reads its own files",
            ha="center",
            transform=axes[2].transAxes,
        )
        axes[2].set_xlabel("storage bandwidth")
    for ax, name in zip(axes, ("vs cache size", "vs workers", "vs bandwidth"), strict=True):
        ax.set_ylabel("samples/s")
        ax.set_ylim(bottom=0)
        ax.axhline(report["ingestion_rate"], color="#4c72b0", lw=0.8, ls="--")
        ax.set_title(name, fontsize=10)
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
    if not rec.get("changed", True):
        text = f"<p>Keep the loader as it is: {e(rec.get('why_unchanged', ''))}</p>"
    else:
        text = (
            f"<p><code>{e(json.dumps(rec['kwargs']))}</code>: predicted "
            f"{rec['predicted_samples_per_s']:,.0f} samples/s ({rec['predicted_speedup']}x). "
            "Apply it: <code>unstall run --config recommendation.json -- python train.py</code></p>"
        )
    for key in ("cache_files", "cache_not_applied"):  # issue 40: a dataset's own files
        if rec.get(key):
            text += f"<p>Cache: {e(rec[key])}</p>"
    if rec.get("fixed"):  # num_workers="auto" recommended: the fixed setting it stands for
        f = rec["fixed"]
        text += (
            f"<p>Instead of the best fixed setting <code>{e(json.dumps(f['kwargs']))}</code> "
            f"(predicted {f['predicted_samples_per_s']:,.0f} samples/s): "
            f"{e(rec['auto']['why'])}</p>"
        )
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
    return text


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
    body = "".join(
        f"<tr><td>{r['index']}</td><td>{e(r['dataset'])}</td><td>{r['batches']}</td>"
        f"<td>{r['samples']}</td><td>{'measured' if r['measured'] else ''}</td></tr>"
        for r in rows
    )
    return (
        "<h2>Loaders of the script</h2><table><tr><th>#</th><th>dataset</th><th>batches</th>"
        f"<th>samples</th><th></th></tr>{body}</table>"
    )


def _page(report: dict[str, Any]) -> str:
    e = html.escape
    s = report["stall"]
    rows = "".join(
        f"<tr><td>{e(r['config'])}</td><td>{r['samples_per_s']:,.0f}</td>"
        f"<td>{r['epoch_s']:,.1f}</td><td>{e(r['bound'])}</td></tr>"
        for r in report["what_if"]
    )
    notes = "".join(f"<li>{e(n)}</li>" for n in [report["split"], *report["notes"]])
    figures = "".join(
        f'<h2>{e(TITLES[name])}</h2><img src="{name}.png" alt="{e(TITLES[name])}" '
        f'onload="this.dataset.ok=this.naturalWidth">'
        for name in ("breakdown", "whatif", "timeline")
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
