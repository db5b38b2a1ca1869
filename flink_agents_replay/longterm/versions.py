"""Versions of long-term memories on a :class:`~.store.VectorStore`: nothing is overwritten or removed by
an agent's writes, so the memory can be read as of any earlier checkpoint, and a replay can fork it.

Every ``add`` or ``update`` writes a new *version* document; the version it replaces is *closed*: its
``valid_to`` becomes the epoch of the write. A ``delete`` closes the current version and writes a
*tombstone* (the deleted-at position). An epoch says which checkpoint a run's writes belong to
(:mod:`flink_agents_replay.flink.epochs`): the trigger time of the last checkpoint before the run started, + 1,
kept with the run in Flink state, so a run in flight at checkpoint ``C`` writes in an epoch ``<= time(C)`` even
after ``C``, whichever job lineage wrote. A reader *as of* ``C`` (a replay from a savepoint of ``C``, as of
``T = time(C)``) sees the versions with ``valid_from <= T < valid_to``: nothing written after the savepoint, and
what was updated or deleted after it as it was; the writes of runs in flight in the savepoint count as part of
it (the replay reuses those runs from production's journal).

Ids come from the call that writes, its *stable id* (:attr:`~flink_agents_replay.api.call_site.CallSite.stable_id`,
the same for every attempt of one logical call): a write made again after a crash, or by the retry of an
action that failed after it, upserts the same documents instead of adding a memory.

A replay writes only into its *overlay* namespace. Its reads merge the overlay (current versions) with
production as of the savepoint; a memory the overlay updated or deleted hides production's.

Document metadata (schema 1, plain data): ``lm_schema``, ``kind`` (``version`` | ``tombstone``),
``memory_id``, ``scope`` (whose memory: a key's digest, or a shared name), ``valid_from``, ``valid_to``
(:data:`CURRENT` while current), the writing run's ``key_digest``, ``seq``, ``event_time_ms``, the
``call_id``, ``stable_id`` and ``step`` (its place in the run) of the call, ``written_ms`` (wall clock, for
people), and the user's metadata under ``m.<name>``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any

from flink_agents_replay.core.errors import MemoryNotFoundError
from flink_agents_replay.integrations.vector_store import StoredDoc, VectorStore, Where

__all__ = ["CURRENT", "SCHEMA", "MemoryNotFoundError", "Position", "VersionedMemory", "compact", "derived_id",
           "describe_epoch", "seen_as_of"]

SCHEMA = 1
#: ``valid_to`` of a current version: the largest integer every backend stores exactly (JSON, float64).
CURRENT = 2 ** 53 - 1
_FIRST_TIME_EPOCH = 10 ** 11  # 1973 in epoch ms: a smaller epoch is a checkpoint id (written before 0.5)
_USER = "m."


@dataclass(frozen=True)
class Position:
    """Where a write happens: the run's epoch, key, seq and event time, and the call making it (``stable_id``:
    the same for every attempt of the call; the ``call_id`` when not given; ``step``: the call's place in its
    run, which orders one run's writes)."""

    epoch: int
    key_digest: str
    seq: int
    event_time_ms: int
    call_id: str
    stable_id: str = ""
    step: int = 0

    @property
    def writer(self) -> str:
        """What ids of this call's documents derive from: one value for every attempt of the call."""
        return self.stable_id or self.call_id


def derived_id(*parts: object) -> str:
    """A 32-hex-digit id from ``parts``: the same parts (a call made again) give the same id."""
    return hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8", "surrogatepass")).hexdigest()[:32]


def _metadata(kind: str, memory_id: str, scope: str, at: Position, user: Mapping[str, Any]) -> dict[str, Any]:
    bad = [name for name, value in user.items() if not isinstance(value, (str, int, float, bool))]
    if bad:
        raise TypeError(f"long-term memory metadata values must be str, int, float or bool: {bad}")
    return {"lm_schema": SCHEMA, "kind": kind, "memory_id": memory_id, "scope": scope, "valid_from": at.epoch,
            "valid_to": CURRENT, "key_digest": at.key_digest, "seq": at.seq, "event_time_ms": at.event_time_ms,
            "call_id": at.call_id, "stable_id": at.writer, "step": at.step, "written_ms": time.time_ns() // 1_000_000,
            **{_USER + name: value for name, value in user.items()}}


def as_item(doc: StoredDoc, source: str, distance: float | None = None) -> dict[str, Any]:
    """A memory as plain data (what ``search`` and ``get_all`` return, and the journal keeps)."""
    meta = doc.metadata
    item = {"id": meta["memory_id"], "memory": doc.text,
            "metadata": {k[len(_USER):]: v for k, v in meta.items() if k.startswith(_USER)},
            "epoch": meta["valid_from"], "seq": meta["seq"], "event_time_ms": meta["event_time_ms"],
            "source": source}
    if distance is not None:
        item["score"] = 1.0 - distance
    return item


class VersionedMemory:
    """Long-term memory of one namespace, read now (production) or as of a checkpoint with an overlay (replay).

    Args:
        store: the vector store.
        namespace: production's namespace (the agent's, or a shared one).
        as_of: ``None`` to read and write production now; a savepoint's epoch to read production as of it.
        overlay: the namespace a replay writes to (required with ``as_of``).
    """

    def __init__(self, store: VectorStore, namespace: str, *, as_of: int | None = None, overlay: str | None = None):
        if (as_of is None) != (overlay is None):
            raise ValueError("as_of and overlay go together: a reader as of a checkpoint writes to an overlay")
        self.store, self.namespace, self.as_of, self.overlay = store, namespace, as_of, overlay
        self.writes_to = overlay or namespace

    # -- reads

    def get_all(self, scope: str, *, filters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Every memory of ``scope`` this reader sees (with user metadata equal to ``filters``), oldest first."""
        docs = [(d, "production") for d in self.store.get(self.namespace, _user(self._production(scope), filters))]
        if self.overlay is not None:
            hidden = self._overlay_ids(scope)
            docs = [(d, s) for d, s in docs if d.metadata["memory_id"] not in hidden]
            docs += [(d, "overlay") for d in self.store.get(self.overlay, _user(_current(scope), filters))]
        docs = _one_per_memory(docs)
        docs.sort(key=lambda pair: (pair[0].metadata["valid_from"], pair[0].metadata["seq"], pair[0].id))
        return [as_item(d, source) for d, source in docs]

    def search(self, scope: str, embedding: Sequence[float], limit: int, *,
               filters: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Up to ``limit`` memories of ``scope`` nearest to ``embedding`` (with user metadata equal to
        ``filters``), nearest first; equally near ones by memory id, so a replay's merged view and production's
        pick the same among ties."""
        wanted = 2 * limit + 4  # candidates beyond the limit: ties at the cut are resolved here, not by the index
        production = _user(self._production(scope), filters)
        hidden = self._overlay_ids(scope) if self.overlay is not None else set()
        found = [(d, dist, "production") for d, dist in
                 self.store.query(self.namespace, embedding, production, wanted + len(hidden))
                 if d.metadata["memory_id"] not in hidden]
        if self.overlay is not None:
            found += [(d, dist, "overlay") for d, dist in
                      self.store.query(self.overlay, embedding, _user(_current(scope), filters), wanted)]
        found = _one_per_memory(found)
        found.sort(key=lambda hit: (round(hit[1], 6), hit[0].metadata["memory_id"]))
        return [as_item(d, source, dist) for d, dist, source in found[:limit]]

    def _production(self, scope: str) -> Where:
        return _current(scope) if self.as_of is None else seen_as_of(Where((("scope", "eq", scope),)), self.as_of)

    def _overlay_ids(self, scope: str) -> set[str]:
        """Memories the overlay wrote or deleted: production's versions of them are hidden."""
        where = Where((("scope", "eq", scope),))
        return {d.metadata["memory_id"] for d in self.store.get(self.overlay, where)}

    def _seen(self, scope: str, memory_id: str, at: Position) -> StoredDoc:
        """The version of ``memory_id`` this reader sees, or the document this call wrote to it already (its
        first attempt, before a crash); :class:`MemoryNotFoundError` if neither."""
        one = Where((("memory_id", "eq", memory_id),))
        mine = self.store.get(self.writes_to, one.and_("stable_id", "eq", at.writer))
        seen = self.store.get(self.writes_to, _current(scope).and_("memory_id", "eq", memory_id))
        if self.overlay is not None and not self.store.get(self.overlay, one.and_("scope", "eq", scope)):
            seen = self.store.get(self.namespace, self._production(scope).and_("memory_id", "eq", memory_id))
        if not (seen or mine):
            raise MemoryNotFoundError(
                f"no memory {memory_id} in {self.writes_to!r} for {scope}: deleted already, never written, or "
                "another scope's (each key has its own memories unless the resource is shared)")
        return (seen or mine)[0]

    # -- writes

    def add(self, scope: str, text: str, embedding: Sequence[float], at: Position, *,
            metadata: Mapping[str, Any] | None = None, index: int = 0) -> str:
        """A new memory; its id is derived from the call (and ``index``, for several adds in one call)."""
        memory_id = derived_id("memory", at.writer, index)
        self._write_version(scope, memory_id, text, embedding, at, metadata or {})
        return memory_id

    def update(self, scope: str, memory_id: str, text: str, embedding: Sequence[float], at: Position, *,
               metadata: Mapping[str, Any] | None = None) -> None:
        """A new version of a memory this reader sees (:class:`MemoryNotFoundError` otherwise), keeping the
        user metadata of the version it replaces unless ``metadata`` gives new values."""
        replaced = self._seen(scope, memory_id, at)
        kept = {k[len(_USER):]: v for k, v in replaced.metadata.items() if k.startswith(_USER)}
        self._write_version(scope, memory_id, text, embedding, at, {**kept, **(metadata or {})})

    def delete(self, scope: str, memory_id: str, at: Position) -> None:
        """Write a memory's tombstone and close its current version (:class:`MemoryNotFoundError` if unseen)."""
        deleted = self._seen(scope, memory_id, at)
        at = self._after_current(scope, memory_id, at)
        # The deleted version's vector: stores want one of the namespace's dimension; searches skip tombstones.
        tombstone = StoredDoc(derived_id("tombstone", memory_id, at.writer), "", deleted.embedding,
                              _metadata("tombstone", memory_id, scope, at, {}))
        self.store.upsert(self.writes_to, [tombstone])
        self._close(scope, memory_id, at.epoch, keep=tombstone.id)

    def _write_version(self, scope: str, memory_id: str, text: str, embedding: Sequence[float], at: Position,
                       user: Mapping[str, Any]) -> None:
        at = self._after_current(scope, memory_id, at)
        version = derived_id("version", memory_id, at.writer)
        doc = StoredDoc(version, text, tuple(float(x) for x in embedding),
                        _metadata("version", memory_id, scope, at, user))
        # Write first, close after: a write that fails between the two leaves the old version current, and the
        # call made again finds it (closing first would lose the memory if the write never came).
        self.store.upsert(self.writes_to, [doc])
        self._close(scope, memory_id, at.epoch, keep=version)

    def _after_current(self, scope: str, memory_id: str, at: Position) -> Position:
        """``at``, its epoch raised to the current version's ``valid_from`` if that is later: a version never
        starts before the one it replaces. (In a shared scope a run in flight at checkpoint C can write after a
        run of epoch C + 1 wrote the same memory; its write then counts after C.)"""
        current = self.store.get(self.writes_to, _current(scope).and_("memory_id", "eq", memory_id))
        latest = max((int(d.metadata["valid_from"]) for d in current), default=at.epoch)
        return at if latest <= at.epoch else replace(at, epoch=latest)

    def _close(self, scope: str, memory_id: str, epoch: int, *, keep: str) -> None:
        """End the current versions of ``memory_id`` in the namespace written to, but ``keep``'s."""
        for doc in self.store.get(self.writes_to, _current(scope).and_("memory_id", "eq", memory_id)):
            if doc.id != keep:
                self.store.update_metadata(self.writes_to, doc.id, {"valid_to": epoch})


def _one_per_memory(items: list[tuple]) -> list[tuple]:
    """``items`` (tuples starting with the document) with one per memory id: the latest version where a write
    left two current (it failed between writing the new version and closing the old one; made again later)."""
    latest: dict[str, Any] = {}
    for item in items:
        meta = item[0].metadata
        order = (meta["valid_from"], meta.get("step", 0), meta.get("written_ms", 0))
        kept = latest.get(meta["memory_id"])
        if kept is None or order > kept[0]:
            latest[meta["memory_id"]] = (order, item)
    return [item for _, item in latest.values()]


def _user(where: Where, filters: Mapping[str, Any] | None) -> Where:
    """``where`` narrowed to memories whose user metadata equals ``filters``."""
    for name, value in (filters or {}).items():
        if not isinstance(value, (str, int, float, bool)):
            raise TypeError(f"a memory filter compares with a str, int, float or bool: {name}={value!r:.60}")
        where = where.and_(_USER + name, "eq", value)
    return where


def describe_epoch(epoch: int) -> str:
    """An epoch for people: a checkpoint time as UTC, or a checkpoint id (epochs before 0.5)."""
    if epoch < _FIRST_TIME_EPOCH:
        return f"checkpoint {epoch}"
    moment = datetime.fromtimestamp(epoch / 1000, timezone.utc)
    return f"epoch {epoch} ({moment.isoformat(timespec='milliseconds').replace('+00:00', 'Z')})"


def seen_as_of(where: Where, epoch: int) -> Where:
    """``where`` narrowed to the versions a reader as of ``epoch`` sees: ``valid_from <= epoch < valid_to``."""
    return where.and_("kind", "eq", "version").and_("valid_from", "lte", epoch).and_("valid_to", "gt", epoch)


def _versions(scope: str) -> Where:
    return Where((("scope", "eq", scope), ("kind", "eq", "version")))


def _current(scope: str) -> Where:
    return _versions(scope).and_("valid_to", "eq", CURRENT)


def compact(store: VectorStore, namespace: str, *, oldest_retained: int) -> int:
    """Delete what no reader as of a retained savepoint can need; return how many documents went.

    The rule: with ``oldest_retained`` the epoch of the oldest savepoint (or retained checkpoint) a replay may
    still start from (its trigger time; its checkpoint id if taken before 0.5), a version closed at or before it
    (``valid_to <= oldest_retained``) is seen by no reader as of an epoch ``>= oldest_retained``, nor by production
    now; a tombstone written at or before it only
    marks a removal that no such reader sees either. Both go. Limit: a run in flight since before
    ``oldest_retained`` that makes its delete again after a crash then finds no memory to delete.
    """
    closed = Where((("kind", "eq", "version"), ("valid_to", "lte", oldest_retained)))
    tombstones = Where((("kind", "eq", "tombstone"), ("valid_from", "lte", oldest_retained)))
    gone = [doc.id for where in (closed, tombstones) for doc in store.get(namespace, where)]
    store.delete(namespace, gone)
    return len(gone)
