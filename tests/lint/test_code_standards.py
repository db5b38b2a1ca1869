"""The code's standards, the first tier of `./run tests` (CI runs it): ruff, including the function size
limits in pyproject.toml, and the layers' import contracts in .importlinter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def _run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean_including_function_size_limits():
    result = _run(str(BIN / "ruff"), "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_layers_depend_one_way_and_product_code_never_imports_dev_tooling():
    result = _run(str(BIN / "lint-imports"), "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = (ROOT / ".importlinter").read_text().count("[importlinter:contract:")
    assert f"Contracts: {contracts} kept, 0 broken." in result.stdout, result.stdout
