"""Short-term memory: one nested dictionary per key, addressed by dotted paths.

An action reads and writes memory through ``ctx.memory``. Every change is recorded as a
:class:`MemoryUpdate`, because the journal stores *updates*, not snapshots: a reused action re-applies
its recorded updates to the memory the checkpoint restored, so a replayed run sees exactly the memory
the original run saw.

Changes count however they are made. ``get`` returns the stored object itself, so the ordinary Python
habit works::

    log = ctx.memory.get("log")
    log.append(entry)            # no set() needed: the change is kept, and journaled

When an action ends, every top-level entry it read is compared with what it was when first read (by its
pickled bytes); a changed entry is journaled whole, as an update of that top-level path. Entries that
changed or were set are then replaced by private copies, so no two entries, and no sent event, share a
mutable object after the action: what a later action changes in one of them cannot show up in another,
which a reused action (whose values come from the journal) could not reproduce. The cost is a pickle of
each entry an action reads (two when it is mutable), and a changed entry is written whole: keep large,
often-changed values in several small entries.
"""

from __future__ import annotations

import copy
import copyreg
import functools
import pickle
from collections.abc import Iterable
from typing import Any

from flink_agents_replay.storage.records.journal import DELETED, MemoryUpdate

__all__ = ["DELETED", "Memory", "MemoryUpdate", "private_copy"]


#: Values that cannot change in place: reading them needs no before/after comparison.
_IMMUTABLE = (str, int, float, bool, bytes, type(None), complex, frozenset)


def _snapshot(value: Any) -> bytes | None:
    """The value's state as bytes, to tell an in-place change; ``None`` if it cannot be pickled (counted as
    changed, so journaling it reports the problem)."""
    try:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - lambdas and the like: cloudpickle knows them
        pass
    try:
        import cloudpickle

        return cloudpickle.dumps(value)
    except Exception:  # noqa: BLE001
        return None


def private_copy(value: Any) -> Any:
    """A deep copy; the value itself if it cannot be copied (journaling it then says why it cannot be kept)."""
    try:
        return _copy_builtin(value, {})
    except (_NotBuiltin, RecursionError):
        pass
    try:
        return copy.deepcopy(value)
    except Exception:  # noqa: BLE001 - locks, sockets...: refused with a clear error when journaled
        return value


class _NotBuiltin(Exception):
    """The value holds something other than builtin scalars, lists, dicts, tuples and plain objects:
    ``copy.deepcopy`` copies it."""


#: Scalars a copy shares (as ``copy.deepcopy`` does).
_ATOMS = frozenset({str, int, float, bool, bytes, type(None), complex})


def _copy_builtin(value: Any, memo: dict[int, Any]) -> Any:
    """``copy.deepcopy`` of builtin data and plain objects (the common case of events, call results and memory),
    several times faster: no dispatch and no hook look-ups per value. Shared and looped parts stay shared, as
    the memo of ``deepcopy`` keeps them."""
    kind = type(value)
    if kind in _ATOMS:
        return value
    done = memo.get(id(value))
    if done is not None:
        return done
    if kind is list:
        memo[id(value)] = copied = []
        copied.extend([_copy_builtin(item, memo) for item in value])
        return copied
    if kind is dict:
        memo[id(value)] = copied = {}
        for key, item in value.items():
            copied[_copy_builtin(key, memo)] = _copy_builtin(item, memo)
        return copied
    if kind is tuple:
        items = tuple([_copy_builtin(item, memo) for item in value])
        # A loop through this tuple made its copy already; a tuple of shared scalars is itself (as in deepcopy).
        done = memo.get(id(value))
        if done is None:
            done = value if all(a is b for a, b in zip(items, value, strict=True)) else items
            memo[id(value)] = done
        return done
    if _copied_by_its_dict(kind):  # events and other plain objects: what deepcopy's default reduce does
        memo[id(value)] = copied = kind.__new__(kind)
        copied.__dict__.update(_copy_builtin(value.__dict__, memo))
        return copied
    raise _NotBuiltin


_DEFAULT_GETSTATE = getattr(object, "__getstate__", None)  # Python 3.11+
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python, not a builtin one


@functools.lru_cache(maxsize=256)
def _copied_by_its_dict(kind: type) -> bool:
    """Whether ``copy.deepcopy`` copies instances of ``kind`` by ``__new__`` and a deep copy of ``__dict__``: no
    copy or pickle hooks of its own, no slots, no builtin base but ``object`` (a ``list`` subclass has items
    besides its dict), not a type ``copy`` or ``copyreg`` treats specially."""
    hooks = ("__deepcopy__", "__setstate__", "__getnewargs__", "__getnewargs_ex__")
    return (isinstance(kind, type) and not issubclass(kind, type) and "__dict__" in dir(kind)
            and kind.__reduce_ex__ is object.__reduce_ex__ and kind.__reduce__ is object.__reduce__
            and getattr(kind, "__getstate__", None) is _DEFAULT_GETSTATE
            and not any(hasattr(kind, hook) for hook in hooks)
            and all(base.__flags__ & _HEAP_TYPE and "__slots__" not in vars(base) for base in kind.__mro__[:-1])
            and kind not in copy._deepcopy_dispatch and kind not in copyreg.dispatch_table)  # noqa: SLF001


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
        self._read: dict[str, bytes | None] = {}  # top-level entry -> its bytes when first read
        self._written: set[str] = set()
        self._taken: list[MemoryUpdate] = []

    def get(self, path: str, default: Any = None) -> Any:
        """The value at ``path`` (the stored object: changing it in place changes memory), or ``default``
        when any part of the path is missing."""
        parts = _split(path)
        self._watch(parts[0])
        node: Any = self._data
        for part in parts:
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    def set(self, path: str, value: Any) -> None:
        """Store ``value`` at ``path``, creating intermediate dictionaries."""
        parts = _split(path)
        if len(parts) == 1:
            self._read.pop(parts[0], None)  # replaced whole: this update holds the new value itself
        else:
            self._watch(parts[0])
        self._written.add(parts[0])
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
        self._watch(parts[0])
        self._written.add(parts[0])
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
        """Return the updates since the last call (in-place changes of read entries included) and forget them.

        Called at the end of each action: entries that changed or were set become private copies.
        """
        changed = {top for top, before in self._read.items() if top in self._data and self._changed(top, before)}
        # Whole-entry updates come last: they hold the entry as the action left it, set() calls included.
        self._updates.extend(MemoryUpdate(top, self._data[top]) for top in sorted(changed))
        for top in changed | self._written:
            if top in self._data:
                self._data[top] = private_copy(self._data[top])
        updates, self._updates = self._updates, []
        self._read, self._written = {}, set()
        self._taken.extend(updates)
        return updates

    @property
    def updates_taken(self) -> list[MemoryUpdate]:
        """Every update :meth:`take_updates` returned so far, in order (a whole run's writes)."""
        return list(self._taken)

    def _changed(self, top: str, before: bytes | None) -> bool:
        """Whether entry ``top`` holds other than what the recorded updates made of it (an in-place change)."""
        now = _snapshot(self._data[top])
        if now == before:
            return False
        if before is None or now is None or top not in self._written:
            return True
        # Set below the top level too: did the set() calls alone make it what it is?
        replayed = Memory({top: pickle.loads(before)})
        replayed.apply(update for update in self._updates if update.path.split(".")[0] == top)
        return top not in replayed.data or _snapshot(replayed.data[top]) != now

    def _watch(self, top: str) -> None:
        """Remember a top-level entry's state when an action first touches it."""
        if top not in self._read and top in self._data and not isinstance(self._data[top], _IMMUTABLE):
            self._read[top] = _snapshot(self._data[top])

    @property
    def data(self) -> dict:
        """The underlying dictionary (owned by this Memory; copy it before sharing)."""
        return self._data
