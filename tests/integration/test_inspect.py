"""`flink-agents-replay inspect`: journal summaries without the signing key, never unpickling payloads."""

import uuid
from collections import Counter

import pytest

from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.engine import RunInput, execute_run
from flink_agents_replay.storage.journal.inspect import key_records, summarize_topic
from flink_agents_replay.storage.journal.kafka_store import KafkaJournalStore
from flink_agents_replay.storage.journal.writer import JournalWriter
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.testing.agents import chain_agent
from flink_agents_replay.testing.counter import InvocationCounter

pytestmark = pytest.mark.integration


def test_summary_and_key_detail(kafka_bootstrap, tmp_path):
    config = {"bootstrap.servers": kafka_bootstrap}
    topic = f"journal-{uuid.uuid4().hex[:8]}"
    store = KafkaJournalStore(config, topic, 16)
    writer = JournalWriter(store, RecordCodec(b"k" * 32, "op"), "per_action")
    agent = chain_agent(InvocationCounter(tmp_path / "c.db"))
    for key in ("alice", "bob:1"):
        group = key_group(key, "STRING", 16)
        memory = {}
        for seq in (1, 2):
            memory = execute_run(agent, RunInput(key, group, seq, f"in-{seq}"), memory,
                                 journal=writer.run_journal(group)).memory
    store.flush(30)
    store.close()

    summary = summarize_topic(config, topic)
    assert len(summary) == 16
    # 2 inputs x (accepted + 6 calls + 1 started record for the external "sender" + 3 completions) per key.
    assert sum(p.records for p in summary) == 2 * 2 * 11
    assert summary[key_group("alice", "STRING", 16)].records >= 22

    records = key_records(config, topic, "bob:1", "STRING")
    assert len(records) == 22
    assert Counter(r.kind for r in records) == Counter({"accepted": 2, "call": 14, "completion": 6})
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    assert {r.action for r in records} == {"_accepted", "classify", "draft", "reply"}
    assert all(r.age_s is not None and r.age_s < 600 for r in records)


def test_cli_prints_summary_and_a_clear_error_for_a_missing_topic(kafka_bootstrap, new_topic):
    import subprocess
    import sys

    topic = new_topic(partitions=4)
    command = [sys.executable, "-m", "flink_agents_replay.cli", "inspect", "--bootstrap-servers", kafka_bootstrap]
    shown = subprocess.run([*command, "--topic", topic, "--all-partitions"], capture_output=True, text=True,
                           timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert f"journal topic {topic}: 4 partitions, 0 records stored" in shown.stdout
    missing = subprocess.run([*command, "--topic", "no-such-topic-here"], capture_output=True, text=True,
                             timeout=120)
    assert missing.returncode == 2 and "not found" in missing.stderr and "Traceback" not in missing.stderr
