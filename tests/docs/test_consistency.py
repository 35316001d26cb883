"""The docs stay current with the code: what they name exists, their lists are whole, their
figures are the bench JSON's, and user pages carry no issue numbers.

**The figure convention.** A figure typed in prose that comes from a bench's JSON carries, right
after it, an HTML comment naming the file (under docs/) and the key, path parts split by
``/``: ``0.99<!-- from bench/train-resnet50.json: result/variants/unstall cpu-lean/fraction_of_G
-->``. Readers see the figure (the comment renders as nothing); this test reads the value and
fails when the figure, rounded as written, differs. Tables come from the JSON itself
(docs/gen_tables.py, docs/gen_reference.py: tested in test_docs.py).
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.docs.markdown_blocks import ROOT

DOCS = ROOT / "docs"
#: the pages a user reads: the README, the changelog, every page of the site (its generated
#: includes too)
USER_PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
FIGURE = re.compile(
    r"(?P<figure>-?[\d,]*\.?\d+)(?P<unit>x|%| %|/s| ms| s)?"
    r"<!-- from (?P<file>\S+): (?P<key>[^>]+?) -->"
)
PATH = re.compile(r"`((?:unstall|tests|docs|examples|\.ci)/[\w./-]*)`")
MODULE = re.compile(r"`(unstall(?:\.\w+)+)")
#: placeholders the docs write in a path's place
PLACEHOLDERS = ("NAME", "FILE", "DIR")


def _pages() -> list[tuple[Path, str]]:
    return [(p, p.read_text()) for p in USER_PAGES]


def test_every_path_the_docs_name_exists():
    missing = []
    for page, text in _pages():
        for path in PATH.findall(text):
            if any(p in path for p in PLACEHOLDERS):
                continue
            if not (ROOT / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert not missing, missing


def test_every_module_and_name_the_docs_name_exists():
    missing = []
    for page, text in _pages():
        for name in sorted(set(MODULE.findall(text))):
            if not _resolves(name):
                missing.append(f"{page.relative_to(ROOT)}: {name}")
    assert not missing, missing


def _resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def test_every_bench_is_listed():
    from unstall.bench.registry import BENCHMARKS

    every_bench = (DOCS / "benchmarks.md").read_text()
    table = every_bench[every_bench.index("## Every bench") :].split("\n## ")[0]
    commands = (DOCS / "commands.md").read_text()
    lists = {
        "docs/benchmarks.md's table": (table, "[`{}`](#{})"),
        "docs/benchmarks.md's sections": (every_bench, "\n## {}\n"),
        "docs/gen_tables.py's BENCHES": ((DOCS / "gen_tables.py").read_text(), '"{}",'),
    }
    assert not _missing(BENCHMARKS, lists)
    # commands.md lists them by including the list generated from the registry
    assert '--8<-- "generated/benches.md"' in commands
    listed = re.findall(r"\[`(\w+)`\]", (DOCS / "generated" / "benches.md").read_text())
    assert listed == list(BENCHMARKS), "run: python docs/gen_tables.py"


def test_every_extra_is_in_the_extras_table():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    page = (DOCS / "getting-started.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `")]
    named = {n for row in rows for n in re.findall(r"`([\w-]+)`", row.split("|")[1])}
    assert set(extras) <= named, sorted(set(extras) - named)


def test_every_unstall_variable_is_in_the_environment_table():
    defined = set()
    for path in (ROOT / "unstall").rglob("*.py"):
        defined |= set(re.findall(r"\b(UNSTALL_[A-Z0-9_]*[A-Z0-9])\b", path.read_text()))
    page = (DOCS / "commands.md").read_text()
    table = page[page.index("Environment variables") :]
    listed = set(re.findall(r"`(UNSTALL_[A-Z0-9_]+)`", table))
    assert defined <= listed, sorted(defined - listed)


def test_figures_in_prose_are_the_json_they_name():
    found, wrong = 0, []
    for page, text in _pages():
        for m in FIGURE.finditer(text):
            found += 1
            source = DOCS / m["file"]
            assert source.is_file(), f"{page.relative_to(ROOT)}: no {m['file']}"
            value = _get(json.loads(source.read_text()), m["key"])
            if not _same(m["figure"], m["unit"] or "", value):
                wrong.append(f"{page.relative_to(ROOT)}: {m[0]!r} but the JSON has {value!r}")
    assert found >= 5, found  # the convention is in use
    assert not wrong, wrong


def _get(doc: Any, key: str) -> Any:
    for part in key.split("/"):
        doc = doc[int(part)] if isinstance(doc, list) else doc[part]
    return doc


def _same(figure: str, unit: str, value: Any) -> bool:
    """Whether ``value`` written as ``figure`` (as many decimals as it shows) is ``figure``;
    a percentage may be written of a fraction."""
    shown = float(figure.replace(",", ""))
    decimals = len(figure.split(".")[1]) if "." in figure else 0
    candidates = [float(value)]
    if unit.strip() == "%":
        candidates.append(float(value) * 100)
    return any(round(c, decimals) == shown for c in candidates)


@pytest.mark.parametrize(
    ("figure", "unit", "value", "same"),
    [
        ("0.99", "", 0.9937, True),
        ("2.9", "x", 2.9023, True),
        ("2.8", "x", 2.9023, False),
        ("14.4", " ms", 14.4253, True),
        ("81", " %", 0.8103, True),
        ("1,423", "/s", 1423.2, True),
    ],
)
def test_the_figure_check_can_fail(figure, unit, value, same):
    assert _same(figure, unit, value) is same


ISSUE = re.compile(r"(?i)\b(?:issue|pr|pull request)s?\s*#?\d+|\(#\d+\)|\bD\d+\b")


def test_user_pages_carry_no_issue_numbers():
    found = []
    for page, text in _pages():
        for m in ISSUE.finditer(text):
            found.append(f"{page.relative_to(ROOT)}: {m[0]!r}")
    assert not found, found


def test_the_issue_check_can_fail():
    for text in ("Goals (issue 47, one GPU)", "since Issue #12", "fixed in (#31)"):
        assert ISSUE.search(text), text
    for text in ("ray#13407 reports hangs", "DALI#5362", "validation (#1: the check"):
        assert not ISSUE.search(text), text


def test_every_guide_is_in_the_guide_lists_and_the_nav():
    guides = sorted(p.relative_to(DOCS).as_posix() for p in (DOCS / "guide").glob("*.md"))
    lists = {
        "docs/index.md's guide table": ((DOCS / "index.md").read_text(), "]({})"),
        "docs/getting-started.md": ((DOCS / "getting-started.md").read_text(), "]({})"),
        "mkdocs.yml's nav": ((ROOT / "mkdocs.yml").read_text(), ": {}\n"),
        "README.md": ((ROOT / "README.md").read_text(), "](docs/{})"),
    }
    assert not _missing(guides, lists)


def _missing(names: Any, lists: dict[str, tuple[str, str]]) -> list[str]:
    """``"LIST misses NAME"`` for each name whose entry (the list's pattern, ``{}`` the name)
    is not in the list's text."""
    return [
        f"{where} misses {name}"
        for where, (text, entry) in lists.items()
        for name in names
        if entry.format(*[name] * entry.count("{}")) not in text
    ]


def test_the_generated_op_list_is_what_the_recognizer_takes():
    """Each operation the supported-data page lists is taken by `parse_transform`, and one
    it does not list is refused with the line the loader prints."""
    v2 = pytest.importorskip("torchvision.transforms.v2")
    import torch

    from unstall.adapt.recognize import GEOMETRIC_OPS, TENSOR_OPS, Refusal, parse_transform

    page = (DOCS / "generated" / "torchvision-ops.md").read_text()
    listed = re.findall(r"^\| `(\w+)` \|", page, flags=re.M)
    assert listed == [*GEOMETRIC_OPS, *TENSOR_OPS]
    made = {
        "RandomResizedCrop": v2.RandomResizedCrop(32),
        "Resize": v2.Resize(32),
        "CenterCrop": v2.CenterCrop(32),
        "RandomCrop": v2.RandomCrop(32),
        "RandomHorizontalFlip": v2.RandomHorizontalFlip(),
    }
    assert set(made) == set(GEOMETRIC_OPS)
    tail = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5] * 3, [0.2] * 3)]
    for name, op in made.items():
        parsed = parse_transform(v2.Compose([op, *tail]))
        assert not isinstance(parsed, Refusal), (name, parsed)
    refused = parse_transform(v2.Compose([v2.ColorJitter(0.1), *tail]))
    assert isinstance(refused, Refusal) and "ColorJitter" in refused.reason
