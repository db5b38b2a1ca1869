"""The versioned long-term memory tests of ``tests/unit/test_longterm_versions.py`` on a real Chroma server.

The server is the project's own (``flink-agents-replay local chroma``; the ``chroma_server`` fixture of
``tests/conftest.py``): installed once into the cache, run from a fresh data directory on a free port.
"""

from __future__ import annotations

import gc
import uuid
import warnings

import pytest

from flink_agents_replay.cli import main as cli_main
from flink_agents_replay.integrations.chroma import ChromaVectorStore, collection_name
from flink_agents_replay.integrations.vector_store import StoredDoc, Where
from flink_agents_replay.local.chroma_server import LocalChromaServer
from flink_agents_replay.local.errors import LocalServiceError
from tests.unit.test_longterm_versions import (  # noqa: F401 - collected here again, on the Chroma store
    NS,
    test_a_reader_as_of_a_checkpoint_sees_memory_as_it_was,
    test_a_replay_writes_only_to_its_overlay_and_reads_both,
    test_a_run_in_flight_at_the_savepoint_writes_into_it,
    test_a_run_in_flight_writing_after_a_later_epoch_in_a_shared_scope_leaves_one_version_per_reader,
    test_a_write_made_again_by_the_same_call_is_one_memory,
    test_bad_metadata_and_filters_are_refused_by_name,
    test_compaction_keeps_what_a_reader_as_of_a_retained_savepoint_sees,
    test_delete_is_a_tombstone_and_can_be_made_again,
    test_scopes_do_not_see_each_other,
    test_update_made_again_keeps_its_own_version_current,
)

pytestmark = pytest.mark.integration
OVERLAY = "triage~replay-r1"


@pytest.fixture
def store(chroma_server):
    with ChromaVectorStore(chroma_server.status().url) as chroma:
        yield chroma
        for namespace in (NS, OVERLAY, "odd/names: ~ü"):
            chroma.drop(namespace)


def test_metadata_updates_merge_and_odd_namespaces_get_their_own_collection(store):
    odd = "odd/names: ~ü"
    store.upsert(odd, [StoredDoc("d1", "text", (1.0, 0.0), {"a": 1, "b": "x"})])
    store.update_metadata(odd, "d1", {"a": 2})
    store.update_metadata(odd, "missing", {"a": 3})  # ignored
    assert store.get(odd, Where()) == [StoredDoc("d1", "text", (1.0, 0.0), {"a": 2, "b": "x"})]
    assert store.get("never-written", Where()) == []
    assert collection_name(odd) != collection_name("odd-names-ü") and collection_name(odd).startswith("odd-names")


def test_the_cli_reports_the_server_and_a_taken_port_is_refused_by_name(chroma_server, capsys, tmp_path):
    assert cli_main(["local", "chroma", "status", "--work-dir", str(chroma_server.work_dir)]) == 0
    assert f"running: pid {chroma_server.status().pid}" in capsys.readouterr().out
    assert chroma_server.start().pid == chroma_server.status().pid  # already running: the same server
    taken = int(chroma_server.status().url.rsplit(":", 1)[1])
    with pytest.raises(LocalServiceError, match=rf"port {taken} on 127.0.0.1 is already in use.*--port 0"):
        LocalChromaServer(tmp_path, port=taken).start()


def test_a_closed_store_leaves_no_socket_open(chroma_server):
    # chromadb's own close() leaves the HTTP sessions of its client and its internal admin client open.
    url = chroma_server.status().url
    namespace = f"closing-{uuid.uuid4().hex[:6]}"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        store = ChromaVectorStore(url)
        store.upsert(namespace, [StoredDoc("d1", "text", (1.0, 0.0), {"a": 1})])
        assert [doc.id for doc in store.get(namespace, Where())] == ["d1"]
        store.drop(namespace)
        store.close()
        del store
        gc.collect()
    port = url.rsplit(":", 1)[1]
    unclosed = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning) and port in str(w.message)]
    assert unclosed == []
