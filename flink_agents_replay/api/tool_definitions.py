"""What each tool of an agent is, kept with every checkpoint, so a restore can say which tools changed and how.

A job's tools are part of what it is: an MCP server may rename a tool, change its arguments or drop it between
a savepoint and the restore of a new build, and a Python tool's schema changes with its signature. Each
checkpoint keeps, per tool, a digest of each of its parts (:func:`tool_digests`: its description, input and
output schemas, annotations, side effects, the server it is on), plain data. A restore compares them with the
restored job's own (:func:`tool_changes`) and reports every tool added, removed or changed, naming the parts.

What then applies is the job's ``fingerprint_policy``, as for changed action code: ``reuse`` and ``re-execute``
go on with a warning per changed tool (journaled calls of a changed tool are reused as they were: they
happened; a run makes its new calls with the tool as it is now), ``fail`` refuses the restore.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from flink_agents_replay.api.resources import Tool

__all__ = ["tool_changes", "tool_definition", "tool_digests"]

#: The parts of a tool's definition, in the order a change names them.
_PARTS = ("kind", "server", "mcp_name", "description", "input_schema", "output_schema", "annotations", "side_effects")


def tool_definition(tool: Tool) -> dict[str, Any]:
    """The tool's definition as plain JSON data: its own ``definition()`` (an MCP tool's), else its name,
    description, input schema and side effects."""
    own = getattr(tool, "definition", None)
    if callable(own):
        return dict(own())
    return {"kind": "function", "name": tool.name, "description": tool.description, "input_schema": tool.schema,
            "side_effects": tool.side_effects.value}


def tool_digests(resources: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Per tool among ``resources`` (by resource name), a short digest of each part of its definition."""
    return {name: {part: _digest(definition.get(part)) for part in _PARTS if part in definition}
            for name, resource in sorted(resources.items()) if isinstance(resource, Tool)
            for definition in (tool_definition(resource),)}


def tool_changes(before: Mapping[str, Mapping[str, str]], now: Mapping[str, Mapping[str, str]]) -> list[str]:
    """What changed from ``before`` (a restored checkpoint's :func:`tool_digests`) to ``now``, one line per tool:
    ``"orders: removed"``, ``"refund: added"``, ``"orders: input_schema, description changed"``."""
    changes = [f"{name}: removed" for name in sorted(set(before) - set(now))]
    changes += [f"{name}: added" for name in sorted(set(now) - set(before))]
    for name in sorted(set(before) & set(now)):
        parts = [part for part in _PARTS if before[name].get(part) != now[name].get(part)]
        if parts:
            changes.append(f"{name}: {', '.join(parts)} changed")
    return changes


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
