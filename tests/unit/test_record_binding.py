"""Where a record belongs (envelope version 3): its topic, partition and key, the key group in its key, the capture's
bound value, key rotation, re-signing for a moved topic, and capture deliveries Kafka refused."""

from __future__ import annotations

import base64
import gzip
import json
from pathlib import Path

import pytest

from flink_agents_replay.core.errors import ConfigError, JournalError, SignatureError
from flink_agents_replay.core.keygroups import key_group
from flink_agents_replay.flink.config import AgentConfig
from flink_agents_replay.storage.capture.manifest import CaptureDescription
from flink_agents_replay.storage.capture.reader import CaptureDecoder
from flink_agents_replay.storage.capture.records import SIGNED_KEY, CapturedInput, CapturedRun
from flink_agents_replay.storage.capture.schemas import CAPTURED_INPUT, capture_codec
from flink_agents_replay.storage.capture.writer import CaptureWriter
from flink_agents_replay.storage.journal.memory_store import MemoryJournalStore
from flink_agents_replay.storage.journal.store import Delivery
from flink_agents_replay.storage.journal.transfer import DumpedRecord, DumpHeader, load_topic
from flink_agents_replay.storage.records.codec import RecordCodec, SigningKeys, signed_version
from flink_agents_replay.storage.records.journal import AcceptedRecord, RecordKind, journal_key, key_digest

OLD_KEY, NEW_KEY, THIRD_KEY = b"o" * 32, b"n" * 32, b"t" * 32
PRODUCTION, REPLAY = "agent.journal", "agent-replay.journal"
RECORD_KEY = journal_key(7, 1, "ev-1", "classify", key_digest("customer:1"))
ACCEPTED = AcceptedRecord(1, "in-1", 5)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "compat"


def _record(codec: RecordCodec | None = None, *, topic: str = PRODUCTION, partition: int | None = 7) -> bytes:
    return (codec or RecordCodec(NEW_KEY, "op")).encode(RECORD_KEY, RecordKind.ACCEPTED, ACCEPTED, topic=topic,
                                                         partition=partition)


# -- journal records: topic, partition, key group ------------------------------------------------------------------
def test_a_record_reads_back_where_it_was_written():
    decoded = RecordCodec(NEW_KEY, "op").decode(RECORD_KEY, _record(), topic=PRODUCTION, partition=7)
    assert decoded.payload == ACCEPTED and signed_version(_record()) == 3


def test_a_replay_journals_record_copied_into_productions_topic_is_rejected():
    copied = _record(topic=REPLAY)  # same signing key and producer: only the topic tells them apart
    with pytest.raises(SignatureError, match=f"read from topic '{PRODUCTION}'"):
        RecordCodec(NEW_KEY, "op").decode(RECORD_KEY, copied, topic=PRODUCTION, partition=7)


def test_a_record_signed_for_no_partition_is_rejected_in_one():
    """The MAC binds the partition itself, not only through the key group in the key."""
    with pytest.raises(SignatureError, match="failed signature verification"):
        RecordCodec(NEW_KEY, "op").decode(RECORD_KEY, _record(partition=None), topic=PRODUCTION, partition=7)


def test_a_record_copied_to_another_partition_is_rejected_for_its_key_group():
    with pytest.raises(SignatureError, match="has key group '7' in its key but is in partition 8"):
        RecordCodec(NEW_KEY, "op").decode(RECORD_KEY, _record(), topic=PRODUCTION, partition=8)


def test_a_key_whose_key_group_is_not_its_partition_is_rejected_even_when_signed_so():
    """A writer that signed a record for partition 8 under a key of key group 7 (a bug, or a forger with the key)."""
    value = _record(partition=8)
    with pytest.raises(SignatureError, match="key group '7' in its key but is in partition 8"):
        RecordCodec(NEW_KEY, "op").decode(RECORD_KEY, value, topic=PRODUCTION, partition=8)


# -- key rotation ----------------------------------------------------------------------------------------------------
def test_after_a_rotation_records_of_the_old_key_still_verify_and_new_ones_use_the_new_key():
    old_record = _record(RecordCodec(OLD_KEY, "op"))
    rotated = RecordCodec(NEW_KEY, "op", verification_keys=[OLD_KEY])
    assert rotated.decode(RECORD_KEY, old_record, topic=PRODUCTION, partition=7).payload == ACCEPTED
    new_record = _record(rotated)
    assert RecordCodec(NEW_KEY, "op").decode(RECORD_KEY, new_record, topic=PRODUCTION, partition=7).payload == ACCEPTED
    with pytest.raises(SignatureError):  # signed with the first key, not an older one
        RecordCodec(OLD_KEY, "op").decode(RECORD_KEY, new_record, topic=PRODUCTION, partition=7)


def test_a_key_in_neither_place_is_rejected():
    third = _record(RecordCodec(THIRD_KEY, "op"))
    with pytest.raises(SignatureError, match="neither the signing key nor one of the verification keys"):
        RecordCodec(NEW_KEY, "op", verification_keys=[OLD_KEY]).decode(RECORD_KEY, third, topic=PRODUCTION,
                                                                      partition=7)


def test_a_short_verification_key_is_refused():
    with pytest.raises(ValueError, match="verification key must be at least 16 bytes"):
        RecordCodec(NEW_KEY, "op", verification_keys=[b"short"])


def test_the_config_takes_verification_keys_checks_them_and_keeps_them_out_of_its_repr():
    settings = {"kafka": {"bootstrap.servers": "k:9092"}, "signing_key": "n" * 32}
    config = AgentConfig(**settings, verification_keys=["o" * 32]).resolved("agent")
    assert config.verification_keys_bytes == (OLD_KEY,) and "o" * 32 not in repr(config)
    with pytest.raises(ConfigError, match="verification_keys"):
        AgentConfig(**settings, verification_keys=["short"]).resolved("agent")
    with pytest.raises(ConfigError, match="verification_keys"):
        AgentConfig(**settings, verification_keys="o" * 32).resolved("agent")  # a string, not a list of keys


# -- records of earlier versions: their own scheme -------------------------------------------------------------------
def _v2_entry(name: str) -> tuple[dict, bytes, bytes]:
    fixture = json.loads((FIXTURES / "v0_2_0" / "records.json").read_text())
    entry = fixture["journal"][name]
    return fixture, base64.b64decode(entry["record_key"]), base64.b64decode(entry["value"])


def test_a_v2_record_still_verifies_by_its_key_and_is_bound_to_its_partition_by_the_key_group():
    fixture, record_key, value = _v2_entry("accepted")
    codec = RecordCodec(base64.b64decode(fixture["signing_key"]), fixture["producer"])
    assert signed_version(value) == 2
    assert codec.decode(record_key, value, topic=PRODUCTION, partition=3).payload.seq == 1
    with pytest.raises(SignatureError, match="is in partition 4"):
        codec.decode(record_key, value, topic=PRODUCTION, partition=4)


def test_the_compat_window_a_v2_record_is_not_bound_to_its_topic():
    """Stated in the codec's docstring and docs/design.md §11: versions 1 and 2 did not sign the topic."""
    fixture, record_key, value = _v2_entry("accepted")
    codec = RecordCodec(base64.b64decode(fixture["signing_key"]), fixture["producer"])
    assert codec.decode(record_key, value, topic="any.other.topic", partition=3).payload.seq == 1


# -- capture records: the topic in the MAC, the key group in the signed value ------------------------------------------
class _Manifest:
    def __init__(self):
        self.entries = []

    def write(self, entry):
        self.entries.append(entry)

    def close(self):
        pass


def _capture_writer(store, manifest=None) -> CaptureWriter:
    description = CaptureDescription("op", store.topic, "STRING", store.partitions, 3)
    return CaptureWriter(store, capture_codec(NEW_KEY, "op"), description, manifest, timeout_s=1.0)


def _captured(store, partition: int) -> bytes:
    return store.records(partition)[0][1]


def test_a_capture_record_carries_its_key_group_and_reads_back_from_its_partition_and_topic():
    store = MemoryJournalStore(4, topic="agent.capture")
    _capture_writer(store).write_input(2, CapturedInput("customer:1", 1, None, {"text": "hi"}, "in-1"))
    record = CaptureDecoder(NEW_KEY, "op").decode(_captured(store, 2), topic="agent.capture", partition=2)
    assert record == CapturedInput("customer:1", 1, None, {"text": "hi"}, "in-1", key_group=2)
    # KafkaSource hands over the value only: the topic is still checked.
    assert CaptureDecoder(NEW_KEY, "op").decode(_captured(store, 2), topic="agent.capture").key_group == 2


def test_a_replays_source_which_knows_no_partition_checks_the_key_group_against_the_key():
    store = MemoryJournalStore(4, topic="agent.capture")
    right = key_group("customer:1", "STRING", 4)
    wrong = (right + 1) % 4
    writer = _capture_writer(store)
    writer.write_input(right, CapturedInput("customer:1", 1, None, "x", "d"))
    writer.write_input(wrong, CapturedInput("customer:1", 2, None, "y", "d"))  # a writer with another key layout
    decoder = CaptureDecoder(NEW_KEY, "op", key_type="STRING", max_parallelism=4)
    assert decoder.decode(_captured(store, right), topic="agent.capture").payload == "x"
    with pytest.raises(SignatureError, match=f"names key group {wrong}, not its key's \\({right} of 4\\)"):
        decoder.decode(_captured(store, wrong), topic="agent.capture")


def test_a_capture_record_copied_to_another_partition_is_rejected():
    store = MemoryJournalStore(4, topic="agent.capture")
    _capture_writer(store).write_run(2, CapturedRun("customer:1", 1, "in-1"))
    with pytest.raises(SignatureError, match="written to partition 2 .* copied to partition 3"):
        CaptureDecoder(NEW_KEY, "op").decode(_captured(store, 2), "offset 0", topic="agent.capture", partition=3)


def test_a_replays_capture_record_copied_into_productions_capture_is_rejected():
    replay = MemoryJournalStore(4, topic="agent-replay.capture")
    _capture_writer(replay).write_input(2, CapturedInput("customer:1", 1, None, {"text": "hi"}, "in-1"))
    with pytest.raises(SignatureError, match="read from topic 'agent.capture'"):
        CaptureDecoder(NEW_KEY, "op").decode(_captured(replay, 2), topic="agent.capture")


def test_a_capture_record_of_a_rotated_key_still_reads():
    store = MemoryJournalStore(4, topic="agent.capture")
    writer = CaptureWriter(store, capture_codec(OLD_KEY, "op"), CaptureDescription("op", store.topic, "STRING", 4, 3),
                           None, timeout_s=1.0)
    writer.write_input(1, CapturedInput("k", 1, None, "x", "d"))
    decoder = CaptureDecoder(NEW_KEY, "op", verification_keys=[OLD_KEY])
    assert decoder.decode(_captured(store, 1), topic="agent.capture", partition=1).payload == "x"
    with pytest.raises(SignatureError):
        CaptureDecoder(NEW_KEY, "op").decode(_captured(store, 1), topic="agent.capture", partition=1)


# -- capture deliveries: a refused record fails the checkpoint -------------------------------------------------------
class _Refused(Delivery):
    def wait(self, timeout_s: float) -> int:
        raise JournalError("Kafka rejected a record of the capture topic: MSG_SIZE_TOO_LARGE")

    def done(self) -> bool:
        return True

    def add_done_callback(self, callback) -> None:
        callback()


class _RefusingStore(MemoryJournalStore):
    """Kafka refuses every record whose value is larger than ``limit`` bytes (as a broker's max.message.bytes)."""

    def __init__(self, partitions: int, *, limit: int):
        super().__init__(partitions, topic="agent.capture")
        self.limit = limit

    def append(self, partition, key, value):
        return _Refused() if len(value) > self.limit else super().append(partition, key, value)


def test_a_capture_record_kafka_refused_fails_the_checkpoint_before_its_manifest_entry():
    store, manifest = _RefusingStore(4, limit=2000), _Manifest()
    writer = _capture_writer(store, manifest)
    writer.write_input(1, CapturedInput("k", 1, None, "small", "d"))
    writer.checkpoint(1, 0, range(4))
    assert [entry.checkpoint_id for entry in manifest.entries] == [1]
    writer.write_input(1, CapturedInput("k", 2, None, "x" * 5000, "d"))
    writer.write_input(1, CapturedInput("k", 3, None, "small", "d"))
    with pytest.raises(JournalError, match=r"1 of the 2 capture records .*MSG_SIZE_TOO_LARGE.*checkpoint 2 fails"):
        writer.checkpoint(2, 0, range(4))
    assert [entry.checkpoint_id for entry in manifest.entries] == [1]  # no entry names the missing record
    writer.checkpoint(3, 0, range(4))  # the failure is reported once; later checkpoints judge their own records
    assert [entry.checkpoint_id for entry in manifest.entries] == [1, 3]


# -- a moved topic under another name: re-signed -----------------------------------------------------------------
def test_re_signing_moves_a_journal_record_to_another_topic_name_after_verifying_it():
    keys = SigningKeys(NEW_KEY, verification_keys=[OLD_KEY])
    old = _record(RecordCodec(OLD_KEY, "op"), topic="old.journal")
    moved = keys.resign(old, record_key=RECORD_KEY, from_topic="old.journal", to_topic="new.journal", partition=7)
    codec = RecordCodec(NEW_KEY, "op")
    assert codec.decode(RECORD_KEY, moved, topic="new.journal", partition=7).payload == ACCEPTED
    with pytest.raises(SignatureError):
        codec.decode(RECORD_KEY, moved, topic="old.journal", partition=7)
    with pytest.raises(SignatureError, match="does not verify"):  # a record that was not valid there is not blessed
        keys.resign(old, record_key=RECORD_KEY, from_topic="elsewhere", to_topic="new.journal", partition=7)


def test_re_signing_a_capture_record_keeps_it_unbound_to_a_partition_and_leaves_old_versions_alone():
    keys = SigningKeys(NEW_KEY)
    codec = capture_codec(NEW_KEY, "op")
    value = codec.encode(SIGNED_KEY, CAPTURED_INPUT, CapturedInput("k", 1, None, "x", "d", 5), topic="old.capture",
                         partition=None)
    moved = keys.resign(value, record_key=SIGNED_KEY, from_topic="old.capture", to_topic="new.capture", partition=5)
    assert CaptureDecoder(NEW_KEY, "op").decode(moved, topic="new.capture", partition=5).payload == "x"
    _, _, v2 = _v2_entry("accepted")
    assert keys.resign(v2, record_key=b"3:x", from_topic="a", to_topic="b", partition=3) == v2
    assert keys.resign(b"not ours", record_key=b"k", from_topic="a", to_topic="b", partition=0) == b"not ours"


def _dump(path: Path, records: list[tuple[bytes, bytes]]) -> Path:
    header = DumpHeader("old.journal", "old-id", 8, dict.fromkeys(range(8), 0),
                        {p: sum(1 for key, _ in records if key.startswith(f"{p}:".encode())) for p in range(8)}, {})
    with gzip.open(path, "wt") as out:
        out.write(json.dumps(header.to_json()) + "\n")
        for offset, (key, value) in enumerate(records):
            out.write(json.dumps(DumpedRecord(7, offset, None, key, value).to_json()) + "\n")
    return path


def test_loading_v3_records_under_another_name_without_keys_is_refused_before_kafka_is_contacted(tmp_path):
    dump = _dump(tmp_path / "d.jsonl.gz", [(RECORD_KEY, _record(topic="old.journal"))])
    unreachable = {"bootstrap.servers": "127.0.0.1:9"}
    with pytest.raises(JournalError, match="signed for that topic name .* load it under its own name"):
        load_topic(unreachable, path=dump, topic="new.journal", timeout_s=1)
    with pytest.raises(JournalError, match="does not verify"):  # keys that did not sign it
        load_topic(unreachable, path=dump, topic="new.journal", signing_keys=SigningKeys(THIRD_KEY), timeout_s=1)
