"""The import contracts can fail: lint-imports, run on a copy of the package, refuses a module planted outside
every layer and an import cycle planted inside functions (where a module-level check would not see it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


@pytest.fixture
def package_copy(tmp_path: Path) -> Path:
    """A copy of the package's Python files and of .importlinter, which lint-imports reads instead of the real
    package (it is first on the path)."""
    shutil.copytree(ROOT / "flink_agents_replay", tmp_path / "flink_agents_replay",
                    ignore=lambda folder, names: [n for n in names if n == "__pycache__" or
                                                  (Path(folder, n).is_file() and not n.endswith(".py"))])
    shutil.copy(ROOT / ".importlinter", tmp_path)
    return tmp_path


def _lint(copy: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": str(copy)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=copy, env=environment, capture_output=True,
                          text=True, timeout=300)


def test_the_unchanged_copy_passes(package_copy: Path):
    result = _lint(package_copy)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_module_outside_every_layer_is_refused(package_copy: Path):
    (package_copy / "flink_agents_replay" / "stray.py").write_text('"""In no layer."""\n')
    (package_copy / "flink_agents_replay" / "storage" / "stray.py").write_text('"""In no layer."""\n')
    result = _lint(package_copy)
    assert result.returncode != 0
    assert "flink_agents_replay.stray" in result.stdout
    assert "flink_agents_replay.storage.stray" in result.stdout


def test_a_cycle_through_imports_inside_functions_is_refused(package_copy: Path):
    # Two modules of one layer that may not import each other, each importing the other inside a function.
    core = package_copy / "flink_agents_replay" / "core"
    with open(core / "home.py", "a") as home:
        home.write("\n\ndef _planted():\n    from flink_agents_replay.core import keygroups  # noqa: F401\n")
    with open(core / "keygroups.py", "a") as keygroups:
        keygroups.write("\n\ndef _planted():\n    from flink_agents_replay.core import home  # noqa: F401\n")
    result = _lint(package_copy)
    assert result.returncode != 0
    assert "No cycles are allowed in flink_agents_replay.core." in result.stdout, result.stdout  # the acyclic contract
