"""Headless Chromium for the tests that look at a page (the analyzer's report, the docs site)."""

from __future__ import annotations

import shutil
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
NOT_INSTALLED = "chromium is not installed (apt-get install chromium)"


def chromium_flags(tmp_path: Path, *extra: str) -> list[str]:
    """The command line up to the page: headless, no network of its own, a fresh profile."""
    return [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        *extra,
        f"--user-data-dir={tmp_path / 'profile'}",
    ]
