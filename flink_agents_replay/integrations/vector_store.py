"""What long-term memory needs from a vector store, and an in-memory one for unit tests.

A store holds *namespaces* (a Chroma collection, a Qdrant collection, a pgvector table), each a set of
:class:`StoredDoc`: an id the writer chooses, a text, its embedding and flat metadata (strings, ints, floats,
bools). Writes are upserts by id, so a write made again after a crash replaces itself instead of adding a
second document. Reads filter on metadata with :class:`Where`, a conjunction of comparisons that every
backend can express. Nothing here knows about versions or replays: :mod:`.versions` builds those on top.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["Metadata", "StoredDoc", "VectorStore", "InMemoryVectorStore", "Where"]

Metadata = Mapping[str, str | int | float | bool]

_OPERATORS: dict[str, Callable[[object, object], bool]] = {
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "lte": operator.le, "gt": operator.gt,
    "gte": operator.ge,
}


@dataclass(frozen=True)
class Where:
    """A conjunction of ``(field, operator, value)`` comparisons on metadata; operators: eq, ne, lt, lte, gt, gte.

    A document without the field does not match a comparison on it.
    """

    clauses: tuple[tuple[str, str, str | int | float | bool], ...] = ()

    def __post_init__(self) -> None:
        for name, op, _ in self.clauses:
            if op not in _OPERATORS:
                raise ValueError(f"unknown comparison {op!r} on {name!r}: one of {sorted(_OPERATORS)}")

    def and_(self, name: str, op: str, value: str | int | float | bool) -> Where:
        """This filter with one more comparison."""
        return Where((*self.clauses, (name, op, value)))

    def matches(self, metadata: Metadata) -> bool:
        """Whether ``metadata`` satisfies every comparison."""
        return all(name in metadata and _OPERATORS[op](metadata[name], value) for name, op, value in self.clauses)


@dataclass(frozen=True)
class StoredDoc:
    """One document of a namespace."""

    id: str
    text: str
    embedding: tuple[float, ...]
    metadata: Metadata = field(default_factory=dict)


class VectorStore(Protocol):
    """The operations long-term memory uses. Every method may raise the backend's errors; the caller's
    ``ctx.call`` journals an exception like any other call's."""

    def upsert(self, namespace: str, docs: Sequence[StoredDoc]) -> None:
        """Write ``docs``, replacing any with the same id (creating the namespace if needed)."""

    def update_metadata(self, namespace: str, doc_id: str, changes: Metadata) -> None:
        """Merge ``changes`` into one document's metadata (a missing document is ignored)."""

    def get(self, namespace: str, where: Where) -> list[StoredDoc]:
        """Every document matching ``where`` (an empty list for a namespace that does not exist)."""

    def query(self, namespace: str, embedding: Sequence[float], where: Where,
              limit: int) -> list[tuple[StoredDoc, float]]:
        """Up to ``limit`` documents matching ``where``, nearest first, with their cosine distance."""

    def delete(self, namespace: str, doc_ids: Sequence[str]) -> None:
        """Remove documents for good (compaction and cleaning only)."""

    def namespaces(self) -> list[str]:
        """The names of the namespaces there are, sorted (what ``memory clean`` looks through)."""

    def drop(self, namespace: str) -> None:
        """Remove a namespace with everything in it (a missing one is ignored)."""


def cosine_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """``1 - cos(a, b)``; 1.0 when either vector is zero."""
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return 1.0 - sum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 1.0


class InMemoryVectorStore:
    """A :class:`VectorStore` in a dict, for unit tests: exact search, ties broken by id."""

    def __init__(self) -> None:
        self.spaces: dict[str, dict[str, StoredDoc]] = {}

    def upsert(self, namespace: str, docs: Sequence[StoredDoc]) -> None:
        space = self.spaces.setdefault(namespace, {})
        for doc in docs:
            space[doc.id] = StoredDoc(doc.id, doc.text, tuple(doc.embedding), dict(doc.metadata))

    def update_metadata(self, namespace: str, doc_id: str, changes: Metadata) -> None:
        doc = self.spaces.get(namespace, {}).get(doc_id)
        if doc is not None:
            self.spaces[namespace][doc_id] = StoredDoc(doc.id, doc.text, doc.embedding,
                                                           {**doc.metadata, **changes})

    def get(self, namespace: str, where: Where) -> list[StoredDoc]:
        return sorted((d for d in self.spaces.get(namespace, {}).values() if where.matches(d.metadata)),
                      key=lambda d: d.id)

    def query(self, namespace: str, embedding: Sequence[float], where: Where,
              limit: int) -> list[tuple[StoredDoc, float]]:
        scored = [(doc, cosine_distance(embedding, doc.embedding)) for doc in self.get(namespace, where)]
        return sorted(scored, key=lambda pair: (pair[1], pair[0].id))[:limit]

    def delete(self, namespace: str, doc_ids: Sequence[str]) -> None:
        space = self.spaces.get(namespace, {})
        for doc_id in doc_ids:
            space.pop(doc_id, None)

    def namespaces(self) -> list[str]:
        return sorted(self.spaces)

    def drop(self, namespace: str) -> None:
        self.spaces.pop(namespace, None)
