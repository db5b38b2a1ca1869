"""Stable digests of Python values, equal across processes and runs for equal values.

Reuse compares a replayed call's arguments and a replayed input with what was journaled, in another
process, perhaps days later. Pickle bytes are not stable for that (set order follows per-process
string hashing), so values are first brought to a canonical form: containers recursively, dicts and
sets sorted, dataclasses and plain objects by their fields.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from typing import Any

import cloudpickle

from flink_agents_replay.api.resources import Tool
from flink_agents_replay.api.tool_schema import model_json_schema
from flink_agents_replay.core.moved import module_in_0_5_1

__all__ = ["digest_value"]

_SCALARS = (str, int, float, bool, bytes, type(None), complex)


def _canonical(value: Any, depth: int = 0) -> Any:
    if depth > 64:
        raise ValueError("value nests too deeply to digest")
    if isinstance(value, _SCALARS):
        return (type(value).__name__, value)
    if isinstance(value, enum.Enum):
        return ("enum", type(value).__qualname__, value.name)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_canonical(v, depth + 1) for v in value))
    if isinstance(value, dict):
        items = sorted(((_canonical(k, depth + 1), _canonical(v, depth + 1)) for k, v in value.items()), key=repr)
        return ("dict", tuple(items))
    if isinstance(value, (set, frozenset)):
        return (type(value).__name__, tuple(sorted((_canonical(v, depth + 1) for v in value), key=repr)))
    if isinstance(value, type):
        return _canonical_class(value, depth)
    if isinstance(value, Tool):  # shown to a model as its schema (its other attributes are per-process caches)
        return ("tool", value.name, _canonical(value.schema, depth + 1))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return ("dataclass", type(value).__qualname__, _canonical(fields, depth + 1))
    if hasattr(value, "__dict__") and not isinstance(value, type) and not callable(value):
        return ("object", type(value).__qualname__, _canonical(vars(value), depth + 1))
    # Anything else (PyFlink Rows, numpy scalars...): its pickle, which is stable for such leaf values.
    return ("pickle", type(value).__qualname__, cloudpickle.dumps(value))


def _canonical_class(kind: type, depth: int) -> Any:
    """A class passed as a value (``response_format=Answer``): by name, and a pydantic model also by its JSON
    schema, so a changed model is a different argument. (Its pickle would hold the class by value when the
    user's module is pickled by value, and pydantic's validators do not pickle.)"""
    fields = _canonical(model_json_schema(kind), depth + 1) if callable(getattr(kind, "model_json_schema", None)) \
        else None
    return ("class", module_in_0_5_1(kind.__module__), kind.__qualname__, fields)  # a moved module: as in 0.5.1


def digest_value(value: Any) -> str:
    """A 32-hex-digit digest of ``value`` that is equal for equal values in any process."""
    return hashlib.sha256(repr(_canonical(value)).encode("utf-8", "surrogatepass")).hexdigest()[:32]
