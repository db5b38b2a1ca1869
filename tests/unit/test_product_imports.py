"""The product does not depend on its development tooling (issue #12).

Product code is the package minus ``local/`` (development services), ``testing/`` (the public testing API),
the CLI and the demo: none of its modules may import those. Checked on the source (every ``import`` and
``from ... import``, also inside functions), so a lazy import cannot slip through.
"""

from __future__ import annotations

import ast
from pathlib import Path

import flink_agents_replay

PACKAGE = Path(flink_agents_replay.__file__).resolve().parent
TOOLING = ("flink_agents_replay.local", "flink_agents_replay.testing", "flink_agents_replay.cli",
           "flink_agents_replay.demo")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_tooling(module: str) -> bool:
    return any(module == name or module.startswith(name + ".") for name in TOOLING)


def _imported(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def test_product_modules_import_no_dev_tooling():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        if _is_tooling(module):
            continue
        bad = sorted(name for name in _imported(ast.parse(path.read_text(encoding="utf-8"))) if _is_tooling(name))
        if bad:
            offenders[module] = bad
    assert offenders == {}, f"product modules importing development tooling: {offenders}"


def test_the_check_sees_a_tooling_import():
    tree = ast.parse("def f():\n    from flink_agents_replay.local.paths import home_dir\n")
    assert any(_is_tooling(name) for name in _imported(tree))
