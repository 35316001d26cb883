"""The docs site: it builds strictly, documents every public name, shows generated figures,
and renders in a browser with the analyzer's report picture in place."""

from __future__ import annotations

import fcntl
import functools
import html as html_lib
import http.server
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import unstall
from tests.browser import CHROMIUM, NOT_INSTALLED, chromium_flags
from tests.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REPORT_PNG = DOCS / "analyze-report.png"
HAS_MKDOCS = all(importlib.util.find_spec(m) for m in ("mkdocs", "material", "mkdocstrings"))
needs_mkdocs = pytest.mark.skipif(not HAS_MKDOCS, reason="mkdocs is not installed ([docs] extra)")
#: the report's plot colours (unstall.analysis.html.COLORS): compute blue, prep orange
PLOT_RGB = {"compute": (0x4C, 0x72, 0xB0), "prep": (0xDD, 0x84, 0x52)}


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once per pytest run: the xdist workers that run a test of it share one
    build (each built its own before: 2-3 builds of ~6 s of CPU a suite), made under a lock in
    the run's own temporary folder (never an earlier run's) and only read by the tests."""
    if not HAS_MKDOCS:
        pytest.skip("mkdocs is not installed ([docs] extra)")
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this run's
    out = shared / "docs-site"
    with open(shared / "docs-site.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when closed
        if not (out / "index.html").exists():
            part = Path(tempfile.mkdtemp(prefix="docs-site-", dir=shared))
            done = subprocess.run(
                [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(part)],
                cwd=ROOT,
                capture_output=True,
                text=True,
                timeout=110,
                env={**_env(), "NO_MKDOCS_2_WARNING": "1"},
            )
            assert done.returncode == 0, done.stderr[-4000:]
            part.rename(out)  # whole or not at all: a failed build leaves no site to reuse
    return out


@needs_mkdocs
def test_mkdocs_build_strict(site):
    pages = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    for page in ("index.html", "getting-started/index.html", "guide/analyze/index.html"):
        assert page in pages, sorted(pages)
    assert (site / "analyze-report.png").read_bytes() == REPORT_PNG.read_bytes()
    # the included tables arrived (no snippet left unexpanded)
    html = (site / "benchmarks" / "index.html").read_text()
    assert "--8&lt;--" not in html and "<table>" in html


def test_every_public_name_has_an_api_entry():
    api = (DOCS / "api.md").read_text()
    entries = set(re.findall(r"^::: unstall\.(\w+)$", api, flags=re.M))
    public = set(unstall._HOMES)
    assert public == set(unstall.__all__)
    assert public <= entries, sorted(public - entries)


@needs_mkdocs
def test_api_entries_have_their_docstrings(site):
    html = (site / "api" / "index.html").read_text()
    for name, home in unstall._HOMES.items():
        assert f'id="unstall.{name}"' in html, name
        doc = (getattr(unstall, name).__doc__ or "").strip().splitlines()
        assert doc, f"unstall.{name} has no docstring"
        first = re.sub(r"`|\*", "", doc[0])[:30]
        text = html_lib.unescape(re.sub(r"<[^>]+>", "", html))
        assert _squash(first) in _squash(text), (name, home, first)


def test_bench_tables_are_generated_from_the_json():
    gen = _load_gen_tables()
    assert gen.main(["--check"]) == 0, "run: python docs/gen_tables.py"
    runs = gen.load_runs()
    assert runs, "no docs/bench/*.json"
    for name, run in runs.items():
        bench = run["benchmark"]
        assert name == bench or name.startswith(f"{bench}-"), name
        assert run["date"] and run["machine"] and run["result"].get("benchmark") == bench
    readme = (ROOT / "README.md").read_text()
    assert gen.START in readme and gen.headline(runs) in readme


def test_pages_include_generated_tables_not_typed_figures():
    """A page with bench figures takes them from docs/bench/tables (snippets)."""
    for page in ("benchmarks.md", "index.md", "guide/cache.md", "guide/shards.md"):
        text = (DOCS / page).read_text()
        assert '--8<-- "bench/tables/' in text, page
    for snippet in re.findall(r'--8<-- "([^"]+)"', (DOCS / "benchmarks.md").read_text()):
        assert (DOCS / snippet).is_file(), snippet
    # the newcomer's pages take their tables from the code and the JSON (docs/gen_reference.py)
    for page, made in [
        ("remedies.md", "remedies"),
        ("supported.md", "torchvision-ops"),
        ("comparison.md", "peers-measured"),
        ("guide/torchvision.md", "torchvision-runs"),
        ("guide/torchvision.md", "torchvision-cpu"),
        ("guide/autotuning.md", "autotune-summary"),
        ("benchmarks.md", "train-goals"),
        ("commands.md", "benches"),
    ]:
        assert f'--8<-- "generated/{made}.md"' in (DOCS / page).read_text(), page


def test_report_picture_is_not_blank_and_its_run_is_kept():
    assert _plot_pixels(REPORT_PNG) > 0.01
    run = json.loads((DOCS / "analyze-report.json").read_text())
    assert run["date"] and run["machine"] and run["command"].startswith("unstall analyze")
    assert run["report"]["bottleneck"] in ("compute", "prep", "fetch")


@pytest.mark.skipif(CHROMIUM is None, reason=NOT_INSTALLED)
@needs_mkdocs
@pytest.mark.parametrize("page", ["", "guide/analyze/"])
def test_pages_render_in_headless_chromium_with_the_report_picture(site, page, tmp_path):
    served, url = _serve(site)
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            *chromium_flags(tmp_path, "--hide-scrollbars"),
            f"--screenshot={shot}",
            "--window-size=1280,2200",
            "--virtual-time-budget=5000",
            url + page,
        ],
        check=True,
        timeout=90,
        capture_output=True,
    )
    # the page and the picture were asked for and served
    assert ("/" + page, 200) in served, served
    assert ("/analyze-report.png", 200) in served, served
    image = np.asarray(Image.open(shot).convert("RGB"))
    assert image.shape[0] >= 1000 and image.std() > 20  # rendered, not one flat colour
    assert len(_colours(shot)[0]) > 500
    # the report's plot colours are on the screen: the picture shows
    assert _plot_pixels(shot) > 0.002


# helpers ------------------------------------------------------------------------------


def _colours(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The picture's distinct RGB colours (rows) and how many pixels have each: counted as
    one 24-bit integer a pixel (`np.unique` by rows took 5 s on a 1280x2200 shot, this 0.05)."""
    flat = np.asarray(Image.open(path).convert("RGB"), dtype=np.uint32).reshape(-1, 3)
    packed, counts = np.unique(flat[:, 0] << 16 | flat[:, 1] << 8 | flat[:, 2], return_counts=True)
    rgb = np.stack([packed >> 16, packed >> 8 & 0xFF, packed & 0xFF], axis=1).astype(np.int16)
    return rgb, counts


def _plot_pixels(path: Path) -> float:
    """Share of pixels in the report's plot colours (blue compute, orange prep bars)."""
    rgb, counts = _colours(path)
    hits = np.zeros(len(rgb), dtype=bool)
    for plot in PLOT_RGB.values():
        hits |= np.abs(rgb - np.array(plot)).sum(axis=1) < 24
    return float(counts[hits].sum() / counts.sum())


def _serve(root: Path) -> tuple[list[tuple[str, int]], str]:
    served: list[tuple[str, int]] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def log_request(self, code="-", size="-"):
            served.append((self.path.split("?")[0], int(code)))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(root))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return served, f"http://127.0.0.1:{server.server_address[1]}/"


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _load_gen_tables():
    return load_script(DOCS / "gen_tables.py", "gen_tables")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def test_readme_links_point_at_pages_and_headings_that_exist():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", readme)
    assert len(links) >= 10
    for link in links:
        if link.startswith(("http://", "https://")):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path
        assert target.is_file(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}
            assert anchor in slugs, (link, sorted(slugs))


#: the newcomer's pages, what each must show (text of the rendered page), and whether the
#: report picture is on it
NEW_PAGES = {
    "remedies/": (["the report names", '"prep": "lean"', "Ray cluster", "filecache"], False),
    "supported/": (["RandomResizedCrop", "Normalize", "cache not applied to", "JPEG"], False),
    "faq/": (["IterableDataset", "macOS", "validation", "__getitem__"], False),
    "comparison/": (
        ["DALI", "FFCV", "Mosaic Streaming", "webdataset", "LitData", "Ray Data"],
        False,
    ),
    "report-walkthrough/": (["Prep-bound", "The three rates", "coordinate"], True),
    "changelog/": (["2026-11-23", "Unreleased"], False),
}


@pytest.mark.skipif(CHROMIUM is None, reason=NOT_INSTALLED)
@needs_mkdocs
@pytest.mark.parametrize("page", sorted(NEW_PAGES))
def test_new_pages_render_in_headless_chromium(site, page, tmp_path_factory):
    """Each page renders (a screenshot, kept in the test's folder and printed), served whole,
    with its text in the rendered DOM and the report picture where it belongs."""
    words, picture = NEW_PAGES[page]
    served, url = _serve(site)
    out = tmp_path_factory.mktemp("shots")
    shot = out / (page.strip("/") + ".png")
    common = ["--window-size=1280,2200", "--virtual-time-budget=5000", url + page]
    # one launch: headless Chromium takes both commands (the DOM, then the screenshot)
    dom = subprocess.run(
        [*chromium_flags(out, "--hide-scrollbars"), f"--screenshot={shot}", "--dump-dom", *common],
        check=True,
        timeout=90,
        capture_output=True,
        text=True,
    ).stdout
    print(f"screenshot: {shot}")
    assert ("/" + page, 200) in served, served
    assert not [s for s in served if s[1] >= 400], served
    text = html_lib.unescape(re.sub(r"<[^>]+>", " ", dom))
    for word in words:
        assert word in text, (page, word)
    assert "--8&lt;--" not in dom and "--8<--" not in text  # every include expanded
    image = np.asarray(Image.open(shot).convert("RGB"))
    assert image.shape[0] >= 1000 and image.std() > 20
    if picture:
        assert ("/analyze-report.png", 200) in served, served
        assert _plot_pixels(shot) > 0.002
