"""``LongTermMemory`` called through the engine's call handling (``ActionCalls``), on the in-memory journal and
vector store: journaled reads reused after a restore, writes made again that stay one memory, the per-key
scope, and a replay's fork (as of the savepoint, writes into the overlay only). Embeddings come from the
local model service through the ``openai`` SDK, as in production.
"""

from __future__ import annotations

import pickle

import pytest

from flink_agents_replay.api.agent import Agent, InputEvent, action
from flink_agents_replay.api.call_site import Fork
from flink_agents_replay.core.errors import MemoryNotFoundError
from flink_agents_replay.engine.failures import journal_action_failed
from flink_agents_replay.engine.gate import Live
from flink_agents_replay.integrations.vector_store import InMemoryVectorStore, Where
from flink_agents_replay.local.embeddings import DIMENSIONS
from flink_agents_replay.local.model_server import StubModelServer
from flink_agents_replay.longterm import ChromaVectorStore, LongTermMemory, OpenAIEmbeddings, overlay_namespace
from flink_agents_replay.longterm.fork_diff import clean_replay, memory_diff
from flink_agents_replay.longterm.versions import Position, VersionedMemory
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.records.journal import ActionFailedRecord, key_digest
from tests.unit.test_engine_calls import KEY, KEY_GROUP, SEQ, ScriptedGate, action_calls

NAMESPACE = "Memo/memory"  # the default: <agent>/<resource>
SCOPE = f"key:{key_digest(KEY)}"


class ProcessDied(BaseException):
    """The process dying inside a call: not an ``Exception``, so no outcome is journaled."""


class FailsAfterWrites(InMemoryVectorStore):
    """A store whose ``n``-th upsert reaches it and then raises ``failure`` (the reply was lost, or the client
    process died)."""

    def __init__(self, n: int, failure: BaseException):
        super().__init__()
        self.left, self.failure = n, failure

    def upsert(self, namespace, docs):
        super().upsert(namespace, docs)
        self.left -= 1
        if self.left == 0:
            raise self.failure


@pytest.fixture(scope="module")
def model():
    with StubModelServer() as server:
        yield server


def agent_with(store, model, **options) -> Agent:
    class Memo(Agent):
        @action(InputEvent)
        def act(event, ctx):  # never run here: the tests drive its calls directly
            pass

    embeddings = OpenAIEmbeddings("local-embed", base_url=model.base_url, api_key="unused", max_retries=0)
    return Memo(resources={"memory": LongTermMemory(store, embeddings, **options)})


def dump(store: InMemoryVectorStore) -> dict:
    return {ns: dict(docs) for ns, docs in store.spaces.items()}


def test_a_restored_run_reuses_what_its_search_found_and_writes_nothing_again(model):
    store, journal = InMemoryVectorStore(), MemoryJournalStore(4)
    first = action_calls(agent_with(store, model), journal, epoch=3)
    added = first.call("memory", "add", "order 7 arrived late", metadata={"topic": "delivery"})
    found = first.call("memory", "search", "late order")["results"]
    assert [hit["memory"] for hit in found] == ["order 7 arrived late"] and found[0]["epoch"] == 3
    assert found[0]["metadata"] == {"topic": "delivery"} and found[0]["id"] == added["results"][0]["id"]

    # Someone else's memory arrives before the restore: the restored run must see what it saw the first time.
    VersionedMemory(store, NAMESPACE).add(SCOPE, "order 8 arrived late too", [1.0] * DIMENSIONS,
                                          Position(4, "kd", 9, 0, "other-call"))
    before, executed = dump(store), model.stats().embeddings
    again = action_calls(agent_with(store, model), journal, restored=True, epoch=3)
    assert again.call("memory", "add", "order 7 arrived late", metadata={"topic": "delivery"}) == added
    assert again.call("memory", "search", "late order")["results"] == found
    assert (again.stats.calls_reused, again.stats.calls_executed) == (2, 0)
    assert dump(store) == before and model.stats().embeddings == executed


def failed_action(calls, error: str) -> None:
    """Journal that the action of ``calls`` failed with ``error`` (what the run engine does when it raises)."""
    site = calls.site
    journal_action_failed(calls.context.journal, site.record_key, site.spec, ActionFailedRecord(
        SEQ, site.order, site.event.id, site.action, error, calls.context.input_digest, calls.calls_to_retry()))


def test_an_exception_after_the_add_leaves_one_memory_when_the_action_is_retried(model):
    store, journal = InMemoryVectorStore(), MemoryJournalStore(4)
    first = action_calls(agent_with(store, model), journal)
    added = first.call("memory", "add", "prefers e-mail")
    failed_action(first, "ValueError: raised by the action after its add")

    again = action_calls(agent_with(store, model), journal, restored=True)
    assert again.call("memory", "add", "prefers e-mail") == added
    assert (again.stats.calls_reused, again.stats.calls_executed) == (1, 0)
    assert len(store.get(NAMESPACE, Where())) == 1


def test_an_add_that_failed_midway_is_retried_under_a_new_call_id_into_the_same_memories(model):
    store, journal = FailsAfterWrites(1, ConnectionError("reply lost")), MemoryJournalStore(4)
    first = action_calls(agent_with(store, model), journal)
    with pytest.raises(ConnectionError):
        first.call("memory", "add", ["likes tea", "hates spam"])
    failed_action(first, "ConnectionError: reply lost")
    assert [d.text for d in store.get(NAMESPACE, Where())] == ["likes tea"]  # the first of two reached it
    first_call = store.get(NAMESPACE, Where())[0].metadata["call_id"]

    again = action_calls(agent_with(store, model), journal, restored=True)
    again.call("memory", "add", ["likes tea", "hates spam"])
    assert again.stats.calls_retried_after_failure == 1
    docs = store.get(NAMESPACE, Where())
    assert sorted(d.text for d in docs) == ["hates spam", "likes tea"]  # two memories, not three
    assert first_call not in {d.metadata["call_id"] for d in docs}  # the retry's own call id wrote them


def test_an_add_in_doubt_after_a_crash_is_one_memory(model):
    store, journal = FailsAfterWrites(2, ProcessDied()), MemoryJournalStore(4)
    with pytest.raises(ProcessDied):
        action_calls(agent_with(store, model), journal).call("memory", "add", ["likes tea", "hates spam"])
    assert len(store.get(NAMESPACE, Where())) == 2  # the write reached the store; its result is in no journal

    again = action_calls(agent_with(store, model), journal, restored=True)
    assert [r["memory"] for r in again.call("memory", "add", ["likes tea", "hates spam"])["results"]] == [
        "likes tea", "hates spam"]
    assert again.stats.calls_executed == 1 and len(store.get(NAMESPACE, Where())) == 2


def test_update_delete_get_and_filters(model):
    store = InMemoryVectorStore()
    calls = action_calls(agent_with(store, model), MemoryJournalStore(4))
    [tea, spam] = [r["id"] for r in calls.call("memory", "add", [
        {"role": "user", "content": "likes tea"}, {"role": "user", "content": "hates spam"}],
        metadata={"kind": "taste"})["results"]]
    calls.call("memory", "add", "lives in Lyon", metadata={"kind": "address"})
    assert calls.call("memory", "update", tea, "likes green tea") == {"id": tea, "memory": "likes green tea",
                                                                       "event": "UPDATE"}
    assert calls.call("memory", "delete", spam) == {"id": spam, "event": "DELETE"}
    assert calls.call("memory", "get", tea)["memory"] == "likes green tea"
    assert calls.call("memory", "get", spam) is None
    assert [m["memory"] for m in calls.call("memory", "get_all", filters={"kind": "taste"})["results"]] == [
        "likes green tea"]
    assert [m["memory"] for m in calls.call("memory", "search", "green tea", filters={"kind": "address"})[
        "results"]] == ["lives in Lyon"]
    assert {d.metadata["scope"] for d in store.get(NAMESPACE, Where())} == {SCOPE}


def test_shared_memory_and_a_namespace_of_ones_own(model):
    store = InMemoryVectorStore()
    calls = action_calls(agent_with(store, model, shared=True, namespace="team-notes"), MemoryJournalStore(4))
    calls.call("memory", "add", "the warehouse closes at six")
    assert store.namespaces() == ["team-notes"]
    assert {d.metadata["scope"] for d in store.get("team-notes", Where())} == {"shared"}


def test_a_replay_reads_as_of_the_savepoint_and_writes_only_its_overlay(model):
    store = InMemoryVectorStore()
    production = action_calls(agent_with(store, model), MemoryJournalStore(4), epoch=2)
    kept = production.call("memory", "add", "order 7 arrived late")["results"][0]["id"]
    later = action_calls(agent_with(store, model), None, epoch=5)  # after the savepoint (checkpoint 3)
    later.call("memory", "update", kept, "order 7 was refunded")
    later.call("memory", "add", "order 9 arrived late")
    before = dump(store)

    fork = Fork(as_of=3, name="trial")
    replay = action_calls(agent_with(store, model), MemoryJournalStore(4), epoch=4,
                          gate=ScriptedGate(Live(call_id_prefix="replay:", fork=fork)))
    assert [m["memory"] for m in replay.call("memory", "search", "order late")["results"]] == [
        "order 7 arrived late"]  # the update and the add after the savepoint are invisible
    replay.call("memory", "update", kept, "order 7 was reshipped")
    replay.call("memory", "add", "asked for a discount")
    assert [(m["memory"], m["source"]) for m in replay.call("memory", "get_all")["results"]] == [
        ("order 7 was reshipped", "overlay"), ("asked for a discount", "overlay")]
    after = dump(store)
    assert {ns: docs for ns, docs in after.items() if ns != overlay_namespace(NAMESPACE, "trial")} == before
    assert store.namespaces() == [NAMESPACE, overlay_namespace(NAMESPACE, "trial")]


def test_misuse_is_refused_by_name(model):
    memory = agent_with(InMemoryVectorStore(), model).resources["memory"]
    with pytest.raises(RuntimeError, match="through ctx.call"):
        memory.invoke("add", "x")
    calls = action_calls(agent_with(InMemoryVectorStore(), model), MemoryJournalStore(4))
    with pytest.raises(ValueError, match="no operation 'forget'"):
        calls.call("memory", "forget", "x")
    with pytest.raises(ValueError, match="non-empty text"):
        calls.call("memory", "add", "  ")
    with pytest.raises(KeyError):
        calls.call("memory", "delete", "no-such-memory")
    with pytest.raises(ValueError, match="search_limit"):
        LongTermMemory(InMemoryVectorStore(), memory.embeddings, search_limit=0)
    with pytest.raises(ValueError, match="needs the server's url"):
        ChromaVectorStore()


def test_the_memory_travels_pickled_without_its_clients(model):
    memory = LongTermMemory(ChromaVectorStore("http://127.0.0.1:8100"),
                            OpenAIEmbeddings("e", base_url=model.base_url, api_key="k"))
    memory.embeddings.embed(["warm the client up"])
    copy = pickle.loads(pickle.dumps(memory))
    assert copy.store.url == "http://127.0.0.1:8100" and copy.store._client is None
    assert copy.embeddings._client is None and copy.embeddings.embed(["x"]) == memory.embeddings.embed(["x"])


def production_after_the_savepoint(store, model) -> str:
    """A memory written before checkpoint 3, then updated and another added after it (epoch 5)."""
    kept = action_calls(agent_with(store, model), None, epoch=2).call("memory", "add", "order 7 late")
    kept_id = kept["results"][0]["id"]
    later = action_calls(agent_with(store, model), None, epoch=5)
    later.call("memory", "update", kept_id, "order 7 refunded")
    later.call("memory", "add", "order 9 late")
    return kept_id


def replay_calls(store, model, name: str):
    return action_calls(agent_with(store, model), None, epoch=4,
                        gate=ScriptedGate(Live(call_id_prefix=f"{name}:", fork=Fork(as_of=3, name=name))))


def test_the_memory_diff_lines_up_a_replay_with_what_production_did_after_the_savepoint(model):
    store = InMemoryVectorStore()
    kept = production_after_the_savepoint(store, model)
    same = replay_calls(store, model, "same")  # the same calls as production's run after the savepoint
    same.call("memory", "update", kept, "order 7 refunded")
    same.call("memory", "add", "order 9 late")
    other = replay_calls(store, model, "other")
    other.call("memory", "update", kept, "order 7 reshipped")
    other.call("memory", "delete", kept)

    unchanged = memory_diff(store, NAMESPACE, as_of=3, replay="same", keys=[KEY])
    assert [(s.key, s.status) for s in unchanged.scopes] == [(KEY, "same")]
    [scope] = memory_diff(store, NAMESPACE, as_of=3, replay="other", keys=[KEY]).scopes
    assert scope.status == "changed"
    assert [(c.event, c.memory) for c in scope.production] == [("UPDATE", "order 7 refunded"), ("ADD", "order 9 late")]
    assert [(c.memory_id, c.event, c.memory) for c in scope.replay] == [
        (kept, "UPDATE", "order 7 reshipped"), (kept, "DELETE", "")]
    report = memory_diff(store, NAMESPACE, as_of=3, replay="other", keys=[KEY])
    assert report.summary == {"scopes": 1, "same": 0, "changed": 1, "production_changes": 2, "replay_changes": 2}
    assert f"  {KEY}:" in report.render_text() and "replay     seq 1: DELETE" in report.render_text()
    assert report.to_json()["scopes"][0]["replay"][1]["event"] == "DELETE"

    production = {ns: docs for ns, docs in dump(store).items() if "@replay:" not in ns}
    assert clean_replay(store, "other") == [overlay_namespace(NAMESPACE, "other")]
    assert clean_replay(store, "missing") == []
    assert {ns: docs for ns, docs in dump(store).items() if "@replay:" not in ns} == production
    assert store.namespaces() == [NAMESPACE, overlay_namespace(NAMESPACE, "same")]


class FlakyCollection:
    """A Chroma collection whose first ``failures`` gets fail as chromadb 1.5.9's server sometimes does."""

    def __init__(self, failures: int):
        self.failures, self.calls = failures, 0

    def get(self, **_kwargs):
        from chromadb.errors import InternalError

        self.calls += 1
        if self.calls <= self.failures:
            raise InternalError("Error executing plan: Internal error: Error creating hnsw segment reader: "
                                "Nothing found on disk")
        return {"ids": ["d"], "documents": ["text"], "embeddings": [[1.0, 0.0]], "metadatas": [{"a": 1}]}


class OneCollectionClient:
    def __init__(self, collection):
        self.collection = collection

    def get_collection(self, _name):
        return self.collection


def test_a_chroma_error_for_a_young_collection_is_retried_for_a_while_then_raised(caplog):
    from chromadb.errors import InternalError

    flaky = FlakyCollection(failures=2)
    store = ChromaVectorStore(client=OneCollectionClient(flaky), retry_s=5)
    assert [d.text for d in store.get("ns", Where())] == ["text"] and flaky.calls == 3
    assert sum("trying again" in r.getMessage() for r in caplog.records) == 2
    with pytest.raises(InternalError, match="hnsw segment reader"):
        ChromaVectorStore(client=OneCollectionClient(FlakyCollection(failures=99)), retry_s=0.3).get("ns", Where())
    with pytest.raises(ValueError, match="retry_s"):
        ChromaVectorStore("http://x", retry_s=-1)


def test_a_delete_of_a_memory_not_seen_is_journaled_by_name_and_reused_as_the_same_error(model):
    store, journal = InMemoryVectorStore(), MemoryJournalStore(4)
    with pytest.raises(MemoryNotFoundError, match="no memory gone-id in 'Memo/memory' .*deleted already"):
        action_calls(agent_with(store, model), journal).call("memory", "delete", "gone-id")
    assert not any(b"flink_agents_replay.longterm" in value or b"flink_agents_replay.core.errors" in value
                   for _, value in journal.records(KEY_GROUP))  # persisted by its name, not its module path
    again = action_calls(agent_with(store, model), journal, restored=True)
    with pytest.raises(MemoryNotFoundError, match="no memory gone-id"):
        again.call("memory", "delete", "gone-id")
    assert again.stats.calls_reused == 1


def test_the_memory_diff_orders_one_runs_writes_by_their_place_in_the_run_not_by_the_clock(model, monkeypatch):
    import flink_agents_replay.longterm.versions as versions

    monkeypatch.setattr(versions.time, "time_ns", lambda: 1_700_000_000_000_000_000)  # every write in one ms
    store = InMemoryVectorStore()
    later = action_calls(agent_with(store, model), None, epoch=5)
    added = later.call("memory", "add", "order 9 late")["results"][0]["id"]
    later.call("memory", "update", added, "order 9 refunded")
    later.call("memory", "delete", added)
    [scope] = memory_diff(store, NAMESPACE, as_of=3, replay="none", keys=[KEY]).scopes
    assert [(c.event, c.memory) for c in scope.production] == [
        ("ADD", "order 9 late"), ("UPDATE", "order 9 refunded"), ("DELETE", "")]
