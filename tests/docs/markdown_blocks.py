"""The fenced code blocks of the README and the docs, with what the runner must do with each.

A block is run unless an HTML comment ``<!-- not-run: REASON -->`` stands on the last
non-blank line before its fence (a reason is required).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*not-run:\s*(\S.*?)\s*-->$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    not_run: str | None  # the reason given, for blocks that are not run

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        prev = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
        reason = NOT_RUN.match(prev)
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        if j == len(lines):
            raise ValueError(f"{path}:{i + 1}: a fence that is never closed")
        out.append(
            Block(path, i + 1, lang, "\n".join(body) + "\n", reason.group(1) if reason else None)
        )
        i = j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for path in markdown_files() for b in blocks(path)]


def unstall_commands(code: str) -> list[str]:
    """The ``unstall ...`` command lines of a shell block (continuations joined, comments cut)."""
    joined = re.sub(r"\\\n\s*", " ", code)
    out = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        for part in re.split(r"\s*(?:&&|;|\|\|)\s*", line):
            if part.startswith("unstall "):
                out.append(part)
    return out
