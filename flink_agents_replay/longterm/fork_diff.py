"""What a replay did to long-term memory, next to what production did after the savepoint, per scope (key).

Both sides are read from the store, not from captures: production's changes are its documents written after
the savepoint (``valid_from > as_of``, the savepoint's epoch: versions and tombstones), the replay's are everything in
its overlay namespace. Each change is an ``ADD`` (a memory the side had not seen), an ``UPDATE`` (a new
version of one it had) or a ``DELETE`` (a tombstone). A replay's call and production's call of the same
logical call derive the same memory id, so the two sides line up by id.

:func:`memory_diff` reads them; :func:`clean_replay` deletes a replay's overlays (``flink-agents-replay
replay clean``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flink_agents_replay.integrations.vector_store import StoredDoc, VectorStore, Where
from flink_agents_replay.longterm.resource import overlay_namespace
from flink_agents_replay.longterm.versions import describe_epoch, seen_as_of
from flink_agents_replay.storage.records.journal import key_digest

__all__ = ["MemoryChange", "MemoryDiff", "ScopeDiff", "clean_replay", "memory_diff"]


@dataclass(frozen=True)
class MemoryChange:
    """One change to one memory: ``event`` ADD | UPDATE | DELETE, the text written (empty for a delete), and
    the seq and epoch of the run that made it."""

    memory_id: str
    event: str
    memory: str
    seq: int
    epoch: int

    def same_effect(self, other: MemoryChange) -> bool:
        """The same change to the same memory (whichever run and epoch made it)."""
        return (self.memory_id, self.event, self.memory) == (other.memory_id, other.event, other.memory)


@dataclass(frozen=True)
class ScopeDiff:
    """The changes of one scope (a key, or a shared namespace) on each side, in the order they were made."""

    scope: str
    key: Any
    production: tuple[MemoryChange, ...]
    replay: tuple[MemoryChange, ...]

    @property
    def status(self) -> str:
        """``same`` when both sides made the same changes, in the same order; else ``changed``."""
        same = len(self.production) == len(self.replay) and all(
            a.same_effect(b) for a, b in zip(self.production, self.replay, strict=True))
        return "same" if same else "changed"


@dataclass
class MemoryDiff:
    """:func:`memory_diff`'s result: one :class:`ScopeDiff` per scope either side changed."""

    namespace: str
    overlay: str
    as_of: int
    scopes: list[ScopeDiff] = field(default_factory=list)

    @property
    def differing(self) -> list[ScopeDiff]:
        return [scope for scope in self.scopes if scope.status != "same"]

    @property
    def summary(self) -> dict[str, int]:
        return {"scopes": len(self.scopes), "same": len(self.scopes) - len(self.differing),
                "changed": len(self.differing),
                "production_changes": sum(len(s.production) for s in self.scopes),
                "replay_changes": sum(len(s.replay) for s in self.scopes)}

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "overlay": self.overlay, "as_of": self.as_of, "summary": self.summary,
                "scopes": [{"scope": s.scope, "key": s.key, "status": s.status,
                            "production": [_change_json(c) for c in s.production],
                            "replay": [_change_json(c) for c in s.replay]} for s in self.scopes]}

    def render_text(self) -> str:
        """Lines for a terminal: the counts, then each differing scope's changes side by side."""
        counts = ", ".join(f"{name} {n}" for name, n in self.summary.items())
        lines = [f"Long-term memory {self.namespace!r} after the savepoint, {describe_epoch(self.as_of)}: {counts}"]
        for scope in self.differing:
            lines.append(f"  {scope.key if scope.key is not None else scope.scope}:")
            lines += [f"    production {_change_text(c)}" for c in scope.production] or ["    production: none"]
            lines += [f"    replay     {_change_text(c)}" for c in scope.replay] or ["    replay: none"]
        if not self.differing:
            lines.append("  none differ: the replay changed memory as production did")
        return "\n".join(lines) + "\n"


def memory_diff(store: VectorStore, namespace: str, *, as_of: int, replay: str,
                keys: Iterable[Any] = ()) -> MemoryDiff:
    """Compare replay ``replay``'s overlay of ``namespace`` with production's changes after epoch ``as_of`` (the
    savepoint's).

    ``keys``: the keys to name in the report (a scope is a key's digest); others are shown by scope.
    """
    overlay = overlay_namespace(namespace, replay)
    names = {f"key:{key_digest(key)}": key for key in keys}
    production_docs = store.get(namespace, Where())
    seen = seen_as_of(Where(), as_of)
    seen_at = {d.metadata["memory_id"] for d in production_docs if seen.matches(d.metadata)}
    existed = {d.metadata["memory_id"] for d in production_docs
               if d.metadata["kind"] == "version" and d.metadata["valid_from"] <= as_of}
    after = _by_scope(d for d in production_docs if d.metadata["valid_from"] > as_of)
    replayed = _by_scope(store.get(overlay, Where()))
    scopes = [ScopeDiff(scope, names.get(scope), _changes(after.get(scope, []), existed),
                        _changes(replayed.get(scope, []), seen_at))
              for scope in sorted(after.keys() | replayed.keys())]
    return MemoryDiff(namespace, overlay, as_of, scopes)


def clean_replay(store: VectorStore, replay: str) -> list[str]:
    """Drop every overlay namespace replay ``replay`` wrote (production's are never touched); return them."""
    suffix = overlay_namespace("", replay)
    dropped = [name for name in store.namespaces() if name.endswith(suffix) and len(name) > len(suffix)]
    for name in dropped:
        store.drop(name)
    return dropped


def _by_scope(docs: Iterable[StoredDoc]) -> Mapping[str, list[StoredDoc]]:
    grouped: dict[str, list[StoredDoc]] = {}
    for doc in docs:
        grouped.setdefault(doc.metadata["scope"], []).append(doc)
    return grouped


def _changes(docs: list[StoredDoc], known: set[str]) -> tuple[MemoryChange, ...]:
    """``docs`` as changes in write order; ``known``: the memories that side had before them."""
    known = set(known)
    changes = []
    for doc in sorted(docs, key=_write_order):
        meta = doc.metadata
        memory_id = meta["memory_id"]
        if meta["kind"] == "tombstone":
            event = "DELETE"
        else:
            event = "UPDATE" if memory_id in known else "ADD"
            known.add(memory_id)
        changes.append(MemoryChange(memory_id, event, doc.text, meta["seq"], meta["valid_from"]))
    return tuple(changes)


def _write_order(doc: StoredDoc) -> tuple:
    meta = doc.metadata
    return meta["valid_from"], meta["seq"], meta.get("step", 0), meta.get("written_ms", 0), doc.id


def _change_json(change: MemoryChange) -> dict[str, Any]:
    return {"id": change.memory_id, "event": change.event, "memory": change.memory, "seq": change.seq,
            "epoch": change.epoch}


def _change_text(change: MemoryChange) -> str:
    text = f" {change.memory!r}" if change.memory else ""
    return f"seq {change.seq}: {change.event} {change.memory_id[:8]}{text}"
