"""The code blocks of the README and docs/, with what each one's marker says about running it.

Every fenced block must follow a marker line (an HTML comment, invisible on GitHub):

* ``<!-- block: run -->``: tests/integration/test_doc_blocks.py runs it in CI (Python with this environment's
  interpreter, shell with bash), against the suite's broker and the stub model;
* ``<!-- block: run by tests/...py -->``: that test runs it (e.g. in a clean venv from the wheel);
* ``<!-- block: not run: <reason> -->``: it is not run, for the reason given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!-- block: (run|run by (\S+)|not run: (.+)) -->$")


@dataclass(frozen=True)
class DocBlock:
    """One fenced block: where it is, its language, its code and its marker (``None``: unmarked)."""

    path: Path
    line: int  # of the opening fence, 1-based
    language: str
    code: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def runs_here(self) -> bool:
        return self.marker == "run"

    @property
    def run_by(self) -> str | None:
        found = MARKER.match(f"<!-- block: {self.marker} -->") if self.marker else None
        return found.group(2) if found else None


def documents() -> list[Path]:
    """The README and every page of docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def blocks(path: Path) -> list[DocBlock]:
    """The fenced blocks of ``path``, in order."""
    lines = path.read_text().splitlines()
    found, start = [], None
    for number, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if start is None:
            start = number
            continue
        previous = lines[start - 1] if start else ""
        marker = MARKER.match(previous)
        found.append(DocBlock(path, start + 1, lines[start][3:].strip(), "\n".join(lines[start + 1:number]) + "\n",
                              marker.group(1) if marker else None))
        start = None
    return found


def all_blocks() -> list[DocBlock]:
    return [block for path in documents() for block in blocks(path)]
