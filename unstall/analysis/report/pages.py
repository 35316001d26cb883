"""The docs page the report links from its recommendation: "which remedy when"
(docs/remedies.md), the table of every remedy, what it needs and its measured row.

The docs have no public address, so the link is to the page in unstall's repository: an
install is a clone (``pip install -e .``), and there the page lies beside the package. The
terminal prints its path; the HTML page links it (``file://``). Installed some other way, the
report names the page by its path in the repository.
"""

from __future__ import annotations

import html
from pathlib import Path

#: The page, by its path in the repository.
REMEDIES_PAGE = "docs/remedies.md"
#: Where the page is, where its file is not beside the package.
IN_REPO = " in unstall's repository"
#: What the link says the page is.
REMEDIES_TITLE = "Which remedy when, and what each needs"


def remedies_file() -> Path | None:
    """The page in the clone the package is installed from, or None where it is not there."""
    path = Path(__file__).resolve().parents[3] / REMEDIES_PAGE
    return path if path.is_file() else None


def remedies_line() -> str:
    """The terminal's line: the title and where the page is (its file where it is there)."""
    path = remedies_file()
    return f"  {REMEDIES_TITLE}: {path or REMEDIES_PAGE + IN_REPO}"


def remedies_html() -> str:
    """The HTML page's paragraph: the title and a link to the page (its path where the file
    is not there)."""
    path = remedies_file()
    name = f"<code>{REMEDIES_PAGE}</code>"
    if path is None:
        return f"<p>{REMEDIES_TITLE}: {name}{html.escape(IN_REPO)}.</p>"
    where = f"<a class='remedies-page' href='{html.escape(path.as_uri())}'>{name}</a>"
    return f"<p>{REMEDIES_TITLE}: {where}{html.escape(IN_REPO)}.</p>"
