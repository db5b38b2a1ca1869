"""The README is a front door and the docs cannot lie quietly: at most 250 lines of README, every code block
marked as run in CI or not run with a reason, the generated reference pages current, and every relative link
and anchor found."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.harness.doc_blocks import ROOT, all_blocks, documents


def test_the_readme_is_at_most_250_lines():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


def test_every_code_block_is_marked_as_run_or_not_run_with_a_reason():
    unmarked = [block.where for block in all_blocks() if block.marker is None]
    assert not unmarked, f"blocks without a <!-- block: ... --> marker on the line before: {unmarked}"


def test_blocks_run_by_another_test_name_a_test_that_reads_their_page():
    for block in all_blocks():
        if block.run_by is None:
            continue
        test = ROOT / block.run_by
        assert test.is_file(), block.where
        assert str(block.path.relative_to(ROOT)) in test.read_text(), f"{block.run_by} does not read {block.where}"


def test_blocks_run_in_ci_are_python_or_shell():
    assert {block.language for block in all_blocks() if block.runs_here} <= {"python", "bash"}
    assert sum(block.runs_here for block in all_blocks()) >= 4


def test_the_pages_made_from_the_code_are_current():
    made = subprocess.run([sys.executable, str(ROOT / "docs" / "generate.py"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stdout + made.stderr


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path) -> set[str]:
    return {_anchor(line.lstrip("#")) for line in path.read_text().splitlines() if re.match(r"^#{1,6} ", line)}


@pytest.mark.parametrize("page", documents(), ids=lambda page: page.name)
def test_every_relative_link_and_anchor_of_a_page_is_found(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue  # http(s), mailto
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists() or (anchor and linked.suffix == ".md" and anchor not in _anchors(linked)):
            missing.append(target)
    assert not missing, f"{page.name}: links not found: {missing}"
