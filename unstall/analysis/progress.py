"""The progress bar `unstall analyze` shows over its runs (both modes)."""

from __future__ import annotations

from typing import Any


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
