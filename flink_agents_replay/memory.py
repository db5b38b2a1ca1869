"""Short-term memory: one nested dictionary per key, addressed by dotted paths.

An action reads and writes memory through ``ctx.memory``. Every write is also recorded as a
:class:`MemoryUpdate`, because the journal stores *updates*, not snapshots: a reused action re-applies
its recorded updates to the memory the checkpoint restored, so a replayed run sees exactly the memory
the original run saw.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["DELETED", "Memory", "MemoryUpdate"]


class _Deleted:
    """Marks a deleted path in an update (distinct from a stored ``None``)."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __reduce__(self):
        return (_Deleted, ())

    def __repr__(self) -> str:
        return "DELETED"


DELETED = _Deleted()


@dataclass(frozen=True)
class MemoryUpdate:
    """``path`` was set to ``value`` (or deleted, when ``value is DELETED``)."""

    path: str
    value: Any


def _split(path: str) -> list[str]:
    if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
        raise ValueError(f"memory path must be a non-empty dotted string like 'a.b.c', got {path!r}")
    return path.split(".")


class Memory:
    """A key's short-term memory: ``get``/``set``/``delete`` by dotted path, with updates recorded.

    Values must be picklable with cloudpickle (they are journaled and kept in Flink state).
    """

    def __init__(self, data: dict | None = None):
        self._data: dict = data if data is not None else {}
        self._updates: list[MemoryUpdate] = []

    def get(self, path: str, default: Any = None) -> Any:
        """The value at ``path``, or ``default`` when any part of the path is missing."""
        node: Any = self._data
        for part in _split(path):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def set(self, path: str, value: Any) -> None:
        """Store ``value`` at ``path``, creating intermediate dictionaries."""
        parts = _split(path)
        node = self._data
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[parts[-1]] = value
        self._updates.append(MemoryUpdate(path, value))

    def delete(self, path: str) -> None:
        """Remove ``path`` if present (a missing path is not an error)."""
        parts = _split(path)
        node: Any = self._data
        for part in parts[:-1]:
            if not isinstance(node, dict) or part not in node:
                break
            node = node[part]
        else:
            if isinstance(node, dict):
                node.pop(parts[-1], None)
        self._updates.append(MemoryUpdate(path, DELETED))

    def __contains__(self, path: str) -> bool:
        sentinel = object()
        return self.get(path, sentinel) is not sentinel

    def to_dict(self) -> dict:
        """A deep copy of the whole memory."""
        return copy.deepcopy(self._data)

    def apply(self, updates: Iterable[MemoryUpdate]) -> None:
        """Re-apply recorded updates (they are recorded again, as if made now)."""
        for update in updates:
            if update.value is DELETED:
                self.delete(update.path)
            else:
                self.set(update.path, update.value)

    def take_updates(self) -> list[MemoryUpdate]:
        """Return the updates recorded since the last call and forget them."""
        updates, self._updates = self._updates, []
        return updates

    @property
    def data(self) -> dict:
        """The underlying dictionary (owned by this Memory; copy it before sharing)."""
        return self._data
