"""The report: JSON fields, a Chrome trace Perfetto can open, an HTML page whose plots render
in a real browser (headless Chromium; skipped where it is not installed)."""

from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from rich.console import Console

from tests.analysis.conftest import derived_of, make_workload, write_files
from tests.browser import CHROMIUM, NOT_INSTALLED, chromium_flags
from tests.docs.markdown_blocks import ROOT
from unstall.analysis import analyze_workload, report_of
from unstall.analysis.report.html import TITLES
from unstall.analysis.report.terminal import print_summary
from unstall.loader.autotune.controller import START_WORKERS


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("files")
    keys = write_files(root, 320, 20_000)
    work = make_workload(root, keys, rate=400, prep_s=0.002, bytes_per_s=3e6, batch_size=8)
    try:
        a = analyze_workload(work, warmup=2, steps=12)
    finally:
        work.dataset.store.close()
    out = tmp_path_factory.mktemp("report")
    return report_of(a, what_if="cache=0.5,workers=4", html_dir=str(out))


def test_json_fields(report):
    for key in ("ingestion_rate", "prep_rate", "prep_rate_per_worker", "fetch_rate"):
        assert isinstance(report[key], float) and report[key] > 0, key
    assert set(report["stall"]) == {"compute", "prep", "fetch"}
    assert sum(report["stall"].values()) == pytest.approx(1, abs=0.01)
    assert report["bottleneck"] == "fetch"  # 3 MB/s of 20 KB samples: 150/s for a 400/s model
    rec = report["recommendation"]
    workers = rec["kwargs"]["num_workers"]  # a count, or "auto" where the tuner is priced best
    assert (workers == "auto" or workers >= 1) and rec["predicted_speedup"] > 1
    assert report["question"]["workers"] == 4 and report["question"]["cache"] == 0.5
    json.dumps(report)  # JSON-safe throughout


def test_chrome_trace(report):
    trace = json.loads(Path(report["trace"]).read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {(e["tid"], e["name"]) for e in events}
    assert {(0, "wait"), (0, "compute"), (1, "fetch"), (1, "prepare"), (2, "prepare")} <= names
    threads = {
        e["tid"]: e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert threads == {0: "training loop", 1: "worker 0", 2: "worker 1"}
    for tid in (0, 1, 2):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == tid)
        assert all(d >= 0 for _, d in spans)
        # one lane never does two things at once (1 µs of rounding allowed)
        assert all(b[0] >= a[1] - 1 for a, b in itertools.pairwise(spans)), tid


def _not_blank(path: Path) -> bool:
    pixels = np.asarray(Image.open(path).convert("RGB"), dtype=np.int16)
    colored = (pixels.max(axis=2) - pixels.min(axis=2)) > 60  # plot colours, not grey/white
    return colored.mean() > 0.005


def test_html_and_pngs(report):
    page = Path(report["html"]).read_text()
    folder = Path(report["html"]).parent
    for name, title in TITLES.items():
        assert f'src="{name}.png"' in page and title in page
        assert _not_blank(folder / f"{name}.png"), name
    assert report["summary"] in page


@pytest.mark.skipif(CHROMIUM is None, reason=NOT_INSTALLED)
def test_renders_in_headless_chromium(report, tmp_path):
    html = Path(report["html"])
    flags = chromium_flags(tmp_path)
    shot = tmp_path / "shot.png"
    # one launch: headless Chromium takes both commands (the DOM, then the screenshot)
    dom = subprocess.run(
        [
            *flags,
            f"--screenshot={shot}",
            "--dump-dom",
            "--window-size=1280,2400",
            "--virtual-time-budget=3000",
            html.as_uri(),
        ],
        check=True,
        timeout=90,
        capture_output=True,
        text=True,
    ).stdout
    assert _not_blank(shot)
    # each plot loaded (its onload handler wrote the image's natural width) under its title
    for name, title in TITLES.items():
        assert title in dom
        tag = dom[dom.index(f'src="{name}.png"') :].split(">", 1)[0]
        assert 'data-ok="' in tag and 'data-ok="0"' not in tag, tag


@pytest.mark.skipif(CHROMIUM is None, reason=NOT_INSTALLED)
def test_auto_row_is_priced_on_the_page(report, tmp_path):
    """``num_workers="auto"`` is always a row with its price (issue 39), in the JSON, the
    page, and the page as a browser builds it."""
    (row,) = [r for r in report["remedies"] if r["remedy"] == "auto"]
    assert row["config"] == {"kwargs": {"num_workers": "auto", **_cache(report)}}
    assert row["predicted_samples_per_s"] > 0 and row["settles_on"] >= 1
    start = min(START_WORKERS, len(os.sched_getaffinity(0)))
    assert row["settling"]["path"][0] == start  # the tuner's start
    state = "recommended" if row["recommended"] else "priced"
    price = f"<td>{row['predicted_samples_per_s']:,.0f}</td>"
    page = Path(report["html"]).read_text()
    assert f"<tr data-remedy='auto' data-state='{state}'>" in page and price in page
    dom = _dom(report, tmp_path)
    tag = f'<tr data-remedy="auto" data-state="{state}">'
    assert tag in dom and price in dom[dom.index(tag) :], dom[-2000:]
    assert f"settles on {row['settles_on']} workers" in dom


@pytest.mark.skipif(CHROMIUM is None, reason=NOT_INSTALLED)
def test_recommendation_links_which_remedy_when(report, tmp_path):
    """The recommendation links "which remedy when" (docs/remedies.md): on the page as the
    browser builds it, after the recommendation, to the page's file in this clone; the
    terminal prints that file's path."""
    dom = _dom(report, tmp_path)
    page = ROOT / "docs" / "remedies.md"
    link = f'<a class="remedies-page" href="{page.as_uri()}"><code>docs/remedies.md</code></a>'
    assert f"Which remedy when, and what each needs: {link}" in dom, dom[-3000:]
    assert dom.index('class="recommendation"') < dom.index(link) < dom.index("<h3>")
    assert page.read_text().startswith("# Which remedy when\n")
    # how to apply it, said once: the file written beside the page, not also the terminal's
    # "apply it: unstall run --config FILE, FILE holding ..."
    rec = report["recommendation"]
    if rec.get("changed", True) and not rec.get("edit"):
        assert dom.lower().count("apply it") == 1, dom[-3000:]
        assert "Apply it: <code>unstall run --config recommendation.json -- python" in dom
        assert "FILE holding" not in dom
    console = Console(record=True, width=400, file=io.StringIO())
    print_summary(report, console)
    assert f"Which remedy when, and what each needs: {page}" in console.export_text()


def _dom(report: dict, tmp_path: Path) -> str:
    """The report's page as headless Chromium builds it."""
    return subprocess.run(
        [*chromium_flags(tmp_path), "--dump-dom", Path(report["html"]).as_uri()],
        check=True,
        timeout=90,
        capture_output=True,
        text=True,
    ).stdout


def _cache(report: dict) -> dict:
    cache = report["recommendation"].get("instead", report["recommendation"])["kwargs"].get("cache")
    return {"cache": cache} if cache else {}


def test_timeline_tells_waiting_from_fetching(report):
    """The loop's waits and the workers' fetches have their own colours in the timeline."""
    from unstall.analysis.report.html import COLORS

    assert COLORS["wait"] != COLORS["fetch"]
    pixels = np.asarray(Image.open(Path(report["html"]).parent / "timeline.png").convert("RGB"))
    flat = pixels.reshape(-1, 3)
    for kind in ("wait", "fetch", "prepare"):
        rgb = np.array([int(COLORS[kind][i : i + 2], 16) for i in (1, 3, 5)])
        assert (np.abs(flat - rgb).sum(axis=1) < 12).sum() > 50, kind


def test_unknown_rates_are_null_with_a_reason():
    """A rate not measured is None with its reason, never infinite; nothing rests on it."""
    from unstall.analysis.model.stage import model_of
    from unstall.analysis.rates.result import Rates
    from unstall.analysis.recommend.stage import advise
    from unstall.analysis.report.build import build_report

    d = derived_of(
        4,
        Rates(800.0, 0.0, 2.0, 1.0, 1e12, 0.0),
        stall={"compute": 0.5, "prep": 0.5, "fetch": 0.0},
        measured=None,
        unknown={"prep": "no worker timings", "fetch": "no worker timings"},
    )
    report = build_report(advise(model_of(d)))
    assert report["prep_rate"] is None and report["fetch_rate"] is None
    assert report["prep_rate_per_worker"] is None
    assert report["not_measured"]["prep"] == "no worker timings"
    rec = report["recommendation"]
    assert rec["changed"] is False and rec["kwargs"] == {"num_workers": 4}
    assert "no worker timings" in rec["why_unchanged"]
    text = json.dumps(report, allow_nan=False)  # raises on inf / nan
    assert "Infinity" not in text
