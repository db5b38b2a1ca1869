"""Moving a journal: when a restore accepts a checkpoint of another topic id, and the dump file's format."""

from __future__ import annotations

import gzip
import json

import pytest

from flink_agents_replay.core.errors import JournalError
from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.storage.journal.transfer import (
    DUMP_FORMAT,
    DumpedRecord,
    DumpHeader,
    moved_journal_refusal,
    read_dump,
)

OLD, NEW = "oldTopicId0000000000AA", "newTopicId0000000000BB"


def refusal(**overrides):
    arguments = {"marker_topic_ids": {OLD}, "current_topic_id": NEW, "accepted_from": OLD,
                 "marker_ends": {0: 5, 1: 7, 2: 0}, "current_ends": {0: 5, 1: 9, 2: 0}, "owned": range(3)}
    return moved_journal_refusal(**{**arguments, **overrides})


def test_a_moved_journal_with_the_offsets_the_checkpoint_needs_is_accepted():
    assert refusal() is None
    assert refusal(accepted_from=("another", OLD)) is None
    # Markers of several subtasks, some written after the move (a restore of a restore): both ids are fine.
    assert refusal(marker_topic_ids={OLD, NEW}) is None


def test_a_topic_id_not_named_is_refused():
    assert "not set" in refusal(accepted_from=None)
    assert "not in accept_moved_journal_from" in refusal(accepted_from="someOtherId")
    assert OLD in refusal(marker_topic_ids={OLD, "third"}, accepted_from=("third",))


def test_a_moved_journal_shorter_than_the_checkpoint_is_refused():
    reason = refusal(current_ends={0: 4, 1: 9, 2: 0})
    assert "partition 0: ends at 4, the checkpoint needs up to 5" in reason


def test_partitions_missing_from_the_markers_are_refused():
    assert "partition count" in refusal(owned=range(4), current_ends={0: 5, 1: 9, 2: 0, 3: 0})


def test_the_option_is_an_agent_config_setting():
    config = AgentConfig.from_mapping({"accept_moved_journal_from": OLD, "journal_enabled": False})
    assert config.resolved("agent").accept_moved_journal_from == OLD


def test_dump_lines_are_plain_data_and_read_back(tmp_path):
    header = DumpHeader("t", "id", 2, {0: 1, 1: 0}, {0: 3, 1: 0}, {"cleanup.policy": "delete"})
    record = DumpedRecord(0, 2, 1_700_000_000_000, b"k\x00", None, (("h", b"\xff"), ("n", None)))
    path = tmp_path / "dump.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        out.write(json.dumps(header.to_json()) + "\n" + json.dumps(record.to_json()) + "\n")
    first = json.loads(gzip.open(path, "rt").readline())
    assert first["format"] == DUMP_FORMAT and first["version"] == 1 and first["low"] == {"0": 1, "1": 0}
    read_header, records = read_dump(path)
    assert read_header == header and list(records) == [record]


def test_a_file_that_is_not_a_dump_is_refused(tmp_path):
    path = tmp_path / "other.gz"
    with gzip.open(path, "wt") as out:
        out.write(json.dumps({"format": "something", "version": 1}) + "\n")
    with pytest.raises(JournalError, match="not a topic dump"):
        read_dump(path)
    with gzip.open(path, "wt") as out:
        out.write(json.dumps({"format": DUMP_FORMAT, "version": 99}) + "\n")
    with pytest.raises(JournalError, match="version 99"):
        read_dump(path)
    with pytest.raises(JournalError, match="cannot open"):
        read_dump(tmp_path / "missing.gz")
