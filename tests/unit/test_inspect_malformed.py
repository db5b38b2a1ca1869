"""``flink-agents-replay inspect --key`` on malformed journal records: a clear message, no traceback (#13 part 5).

The command reads a real topic in production; here its Kafka parts are replaced by the in-memory journal holding
crafted records, and the command runs through the CLI's ``main``.
"""

import struct

import pytest

from flink_agents_replay import cli
from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.storage.journal import inspect as inspect_journal
from flink_agents_replay.storage.journal.inspect import PartitionSummary
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import key_digest

PARTITIONS = 4
KEY = "customer-7"
GROUP = key_group(KEY, "STRING", PARTITIONS)


def journal_key(seq: int, action: str = "classify") -> bytes:
    return f"{GROUP}:{seq}:event-{seq}:{action}:{key_digest(KEY)}".encode()


@pytest.fixture
def journal(monkeypatch):
    store = MemoryJournalStore(PARTITIONS)
    store.close = lambda: None
    monkeypatch.setattr(inspect_journal, "KafkaJournalStore", lambda *args, **kwargs: store)
    monkeypatch.setattr(inspect_journal, "summarize_topic", lambda *args, **kwargs: [
        PartitionSummary(p, 0, len(store.records(p))) for p in range(PARTITIONS)])
    return store


def inspect_key(capsys) -> tuple[int, str, str]:
    code = cli.main(["inspect", "--bootstrap-servers", "127.0.0.1:1", "--topic", "j", "--key", KEY])
    out, err = capsys.readouterr()
    return code, out, err


def test_malformed_values_are_listed_as_malformed(journal, capsys):
    assert RecordCodec.peek_header(b"FARJ") is None
    values = [
        b"FA",                                                    # truncated
        b"XXXX" + bytes(40),                                      # bad magic
        b"FARJ" + struct.pack(">BI", 2, 5) + b"{nope" + bytes(32),  # a header that is not JSON
        b"FARJ" + struct.pack(">BI", 2, 3) + b"123" + bytes(32),    # JSON, but not a header
    ]
    for seq, value in enumerate(values, start=1):
        journal.append(GROUP, journal_key(seq), value)
    code, out, err = inspect_key(capsys)
    assert code == 0 and "Traceback" not in err
    assert out.count("malformed") == len(values), out


def test_a_record_that_is_not_a_journal_record_is_a_clear_error(journal, capsys):
    journal.append(GROUP, b"something else entirely", b"{}")
    code, out, err = inspect_key(capsys)
    assert code == 2 and "Traceback" not in err
    assert "offset 0" in err and "not a flink-agents-replay journal key" in err
