"""How long each integration test file takes, for the order pytest-xdist workers take files in.

``./run tests`` runs the integration tier on two workers, a file per worker at a time (``--dist loadfile``); a
worker takes the next file in collection order when it is free. The longest files first end the run sooner
(longest processing time first): a long file taken last runs alone while the other worker idles.
``tests/integration/file_durations.json`` holds each file's seconds from a full run; the order only needs them
roughly right. Refresh it from a JUnit report of the tier (``TEST_REPORTS=DIR ./run tests integration``)::

    .venv/bin/python -m tests.harness.file_durations DIR/integration.xml
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

__all__ = ["DURATIONS_FILE", "file_seconds", "longest_first"]

DURATIONS_FILE = Path(__file__).resolve().parents[1] / "integration" / "file_durations.json"


def file_seconds(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """Seconds per test file name (``test_x.py``); empty when the file is missing."""
    return json.loads(path.read_text()) if path.is_file() else {}


def longest_first(items: list, seconds: dict[str, float]) -> None:
    """Sort pytest items in place: files by their seconds, longest first; unknown files last, in collection order."""
    items.sort(key=lambda item: -seconds.get(Path(str(item.path)).name, 0.0))


def _from_junit(report: Path) -> dict[str, float]:
    totals: Counter = Counter()
    for case in ElementTree.parse(report).iter("testcase"):
        totals[case.get("classname").rsplit(".", 1)[-1] + ".py"] += float(case.get("time") or 0)
    return {name: round(seconds, 1) for name, seconds in totals.most_common()}


if __name__ == "__main__":
    DURATIONS_FILE.write_text(json.dumps(_from_junit(Path(sys.argv[1])), indent=1) + "\n")
    print(f"wrote {DURATIONS_FILE}")
