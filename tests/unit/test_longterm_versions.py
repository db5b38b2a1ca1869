"""Versioned long-term memory on the in-memory store: idempotent writes, the as-of view, the replay overlay.

``tests/integration/test_longterm_chroma.py`` runs these same tests on a real Chroma server.
"""

from __future__ import annotations

import pytest

from flink_agents_replay.integrations.vector_store import InMemoryVectorStore, Where
from flink_agents_replay.longterm.versions import CURRENT, MemoryNotFoundError, Position, VersionedMemory, compact

NS, SCOPE = "triage", "key-a"
NEAR_A, NEAR_B, NEAR_C = (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0)


def at(epoch: int, call: str, seq: int = 1) -> Position:
    return Position(epoch=epoch, key_digest="kd", seq=seq, event_time_ms=1000 * seq, call_id=call)


def texts(items) -> list[str]:
    return [item["memory"] for item in items]


@pytest.fixture
def store() -> InMemoryVectorStore:
    return InMemoryVectorStore()


def test_a_write_made_again_by_the_same_call_is_one_memory(store):
    memory = VersionedMemory(store, NS)
    first = memory.add(SCOPE, "likes tea", NEAR_A, at(1, "call-1"))
    again = memory.add(SCOPE, "likes tea", NEAR_A, at(1, "call-1"))  # the call made again after a crash
    other = memory.add(SCOPE, "likes tea", NEAR_A, at(1, "call-2"))
    assert first == again != other
    assert texts(memory.get_all(SCOPE)) == ["likes tea", "likes tea"]
    assert len(store.get(NS, Where())) == 2


def test_update_made_again_keeps_its_own_version_current(store):
    memory = VersionedMemory(store, NS)
    mid = memory.add(SCOPE, "v1", NEAR_A, at(1, "add"))
    memory.update(SCOPE, mid, "v2", NEAR_A, at(2, "upd"))
    memory.update(SCOPE, mid, "v2", NEAR_A, at(2, "upd"))  # retry: must not close what its first attempt wrote
    assert texts(memory.get_all(SCOPE)) == ["v2"]
    versions = sorted(store.get(NS, Where()), key=lambda d: d.metadata["valid_from"])
    assert [(d.text, d.metadata["valid_from"], d.metadata["valid_to"]) for d in versions] == [
        ("v1", 1, 2), ("v2", 2, CURRENT)]


def test_delete_is_a_tombstone_and_can_be_made_again(store):
    memory = VersionedMemory(store, NS)
    mid = memory.add(SCOPE, "old address", NEAR_A, at(1, "add"))
    memory.delete(SCOPE, mid, at(3, "del", seq=7))
    memory.delete(SCOPE, mid, at(3, "del", seq=7))  # retry after a crash
    assert memory.get_all(SCOPE) == []
    assert memory.search(SCOPE, NEAR_A, 5) == []
    tombstones = store.get(NS, Where((("kind", "eq", "tombstone"),)))
    assert [(t.metadata["memory_id"], t.metadata["valid_from"], t.metadata["seq"]) for t in tombstones] == [
        (mid, 3, 7)]
    with pytest.raises(MemoryNotFoundError):
        memory.delete(SCOPE, mid, at(4, "del-again"))
    with pytest.raises(MemoryNotFoundError):
        memory.update(SCOPE, "no-such-id", "x", NEAR_A, at(4, "upd"))


def _production_history(store) -> dict[str, str]:
    """Epochs 1-5 of production; a savepoint of checkpoint 3 is taken after epoch 3's runs."""
    memory = VersionedMemory(store, NS)
    ids = {
        "kept": memory.add(SCOPE, "kept", NEAR_A, at(1, "a1")),
        "deleted later": memory.add(SCOPE, "deleted later", NEAR_B, at(1, "a2")),
        "updated later": memory.add(SCOPE, "updated later v1", NEAR_C, at(2, "a3")),
        "changed within 3": memory.add(SCOPE, "changed within 3 v1", NEAR_A, at(3, "a4")),
    }
    memory.update(SCOPE, ids["changed within 3"], "changed within 3 v2", NEAR_A, at(3, "u1"))
    memory.update(SCOPE, ids["updated later"], "updated later v2", NEAR_C, at(4, "u2"))
    ids["added later"] = memory.add(SCOPE, "added later", NEAR_A, at(4, "a5"))
    memory.delete(SCOPE, ids["deleted later"], at(5, "d1"))
    return ids


def test_a_reader_as_of_a_checkpoint_sees_memory_as_it_was(store):
    _production_history(store)
    replay = VersionedMemory(store, NS, as_of=3, overlay="triage~replay-r1")
    assert texts(replay.get_all(SCOPE)) == ["kept", "deleted later", "updated later v1", "changed within 3 v2"]
    found = texts(replay.search(SCOPE, NEAR_A, 10))
    assert "added later" not in found and "updated later v2" not in found
    assert set(found[:2]) == {"changed within 3 v2", "kept"}  # the two nearest to NEAR_A first
    assert texts(VersionedMemory(store, NS).get_all(SCOPE)) == [
        "kept", "changed within 3 v2", "updated later v2", "added later"]


def test_a_run_in_flight_at_the_savepoint_writes_into_it(store):
    replay = VersionedMemory(store, NS, as_of=3, overlay="triage~replay-r1")
    VersionedMemory(store, NS).add(SCOPE, "written by a run of epoch 3 after the barrier", NEAR_B, at(3, "late"))
    assert texts(replay.get_all(SCOPE)) == ["written by a run of epoch 3 after the barrier"]


def test_a_replay_writes_only_to_its_overlay_and_reads_both(store):
    ids = _production_history(store)
    before = store.get(NS, Where())
    replay = VersionedMemory(store, NS, as_of=3, overlay="triage~replay-r1")
    replay.update(SCOPE, ids["kept"], "kept, changed by the replay", NEAR_A, at(4, "r-u"))
    replay.delete(SCOPE, ids["updated later"], at(4, "r-d"))
    new = replay.add(SCOPE, "replay's own", NEAR_B, at(4, "r-a"))
    with pytest.raises(MemoryNotFoundError):  # production added it after the savepoint: the replay cannot see it
        replay.update(SCOPE, ids["added later"], "x", NEAR_A, at(4, "r-u2"))

    assert store.get(NS, Where()) == before
    seen = {item["id"]: (item["memory"], item["source"]) for item in replay.get_all(SCOPE)}
    assert seen == {ids["kept"]: ("kept, changed by the replay", "overlay"),
                    ids["deleted later"]: ("deleted later", "production"),
                    ids["changed within 3"]: ("changed within 3 v2", "production"),
                    new: ("replay's own", "overlay")}
    hits = replay.search(SCOPE, NEAR_B, 2)
    assert {h["memory"] for h in hits} == {"deleted later", "replay's own"}
    assert all(h["score"] == pytest.approx(1.0) for h in hits)
    assert "kept" not in texts(replay.search(SCOPE, NEAR_A, 10))


def test_scopes_do_not_see_each_other(store):
    memory = VersionedMemory(store, NS)
    memory.add("key-a", "a's", NEAR_A, at(1, "c1"))
    memory.add("key-b", "b's", NEAR_A, at(1, "c2"))
    assert texts(memory.get_all("key-a")) == ["a's"]
    assert texts(memory.search("key-b", NEAR_A, 5)) == ["b's"]


def test_bad_metadata_and_filters_are_refused_by_name(store):
    with pytest.raises(TypeError, match="metadata values"):
        VersionedMemory(store, NS).add(SCOPE, "x", NEAR_A, at(1, "c"), metadata={"tags": ["a"]})
    with pytest.raises(ValueError, match="unknown comparison 'like'"):
        Where((("memory_id", "like", "x"),))
    with pytest.raises(ValueError, match="as_of and overlay go together"):
        VersionedMemory(store, NS, as_of=3)


def test_compaction_keeps_what_a_reader_as_of_a_retained_savepoint_sees(store):
    memory = VersionedMemory(store, NS)
    kept = memory.add(SCOPE, "v1", NEAR_A, at(1, "add"))
    memory.update(SCOPE, kept, "v2", NEAR_A, at(3, "upd"))
    memory.update(SCOPE, kept, "v3", NEAR_A, at(6, "upd2"))
    gone = memory.add(SCOPE, "old", NEAR_B, at(1, "add2"))
    memory.delete(SCOPE, gone, at(2, "del"))
    views = {c: texts(VersionedMemory(store, NS, as_of=c, overlay="o").get_all(SCOPE)) for c in range(4, 9)}

    assert compact(store, NS, oldest_retained=4) == 3  # v1 (closed at 3), "old" (closed at 2), its tombstone
    assert {c: texts(VersionedMemory(store, NS, as_of=c, overlay="o").get_all(SCOPE)) for c in range(4, 9)} == views
    assert texts(memory.get_all(SCOPE)) == ["v3"]
    assert sorted(d.text for d in store.get(NS, Where())) == ["v2", "v3"]
    assert compact(store, NS, oldest_retained=4) == 0


class FailsOnce(InMemoryVectorStore):
    """A store whose next ``method`` call raises ``ConnectionError`` after (``after=True``) or before doing it."""

    def __init__(self):
        super().__init__()
        self.armed: tuple[str, bool] | None = None

    def arm(self, method: str, *, after: bool) -> None:
        self.armed = (method, after)

    def _maybe_fail(self, method: str, when_after: bool) -> None:
        if self.armed == (method, when_after):
            self.armed = None
            raise ConnectionError(f"{method} lost")

    def upsert(self, namespace, docs):
        self._maybe_fail("upsert", False)
        super().upsert(namespace, docs)
        self._maybe_fail("upsert", True)

    def update_metadata(self, namespace, doc_id, changes):
        self._maybe_fail("update_metadata", False)
        super().update_metadata(namespace, doc_id, changes)


@pytest.mark.parametrize("fault", [("upsert", False), ("upsert", True), ("update_metadata", False)])
@pytest.mark.parametrize("operation", ["update", "delete"])
def test_a_write_that_failed_halfway_is_completed_by_the_call_made_again(fault, operation):
    store = FailsOnce()
    memory = VersionedMemory(store, NS)
    mid = memory.add(SCOPE, "v1", NEAR_A, at(1, "add"))
    write = (lambda: memory.update(SCOPE, mid, "v2", NEAR_B, at(2, "w"))) if operation == "update" else (
        lambda: memory.delete(SCOPE, mid, at(2, "w")))
    store.arm(fault[0], after=fault[1])
    with pytest.raises(ConnectionError):
        write()
    assert len(memory.get_all(SCOPE)) == 1  # never none: the memory is not lost between the two steps
    write()  # the same call, made again
    assert texts(memory.get_all(SCOPE)) == (["v2"] if operation == "update" else [])
    assert texts(VersionedMemory(store, NS, as_of=1, overlay="o").get_all(SCOPE)) == ["v1"]


def test_a_run_in_flight_writing_after_a_later_epoch_in_a_shared_scope_leaves_one_version_per_reader(store):
    memory = VersionedMemory(store, NS)
    mid = memory.add("shared", "v1", NEAR_A, at(1, "add"))
    memory.update("shared", mid, "by the run of epoch 6", NEAR_A, at(6, "b"))
    memory.update("shared", mid, "by the run in flight at 5", NEAR_A, at(5, "a"))  # written last, epoch 5
    for as_of in range(1, 9):
        assert len(VersionedMemory(store, NS, as_of=as_of, overlay="o").get_all("shared")) == 1, as_of
    assert texts(memory.get_all("shared")) == ["by the run in flight at 5"]  # the last write is current
    assert texts(VersionedMemory(store, NS, as_of=5, overlay="o").get_all("shared")) == ["v1"]  # counted after 5
