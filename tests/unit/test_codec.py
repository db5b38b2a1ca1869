"""The journal envelope: round trip, and every way a record can fail verification."""

import pytest

from flink_agents_replay.api.memory import MemoryUpdate
from flink_agents_replay.core.errors import NotPicklableError, SignatureError
from flink_agents_replay.storage.records.codec import RecordCodec
from flink_agents_replay.storage.records.journal import (
    CallOutcome,
    CallRecord,
    CompletionRecord,
    RecordKind,
    journal_key,
    key_digest,
    parse_journal_key,
)

KEY = b"k" * 32
RECORD_KEY = journal_key(7, 3, "ev", "classify", key_digest("customer:1"))
HERE = {"topic": "agent.journal", "partition": 7}  # where RECORD_KEY's records are written and read


def _call(result) -> CallRecord:
    return CallRecord(3, 0, "ev", "classify", 0, "llm", "d1", CallOutcome.RETURNED, result)


def test_round_trip_keeps_kind_fingerprint_and_payload():
    codec = RecordCodec(KEY, "agent-x")
    completion = CompletionRecord(3, 0, "ev", "classify", "fp1", [MemoryUpdate("a", [1, 2])], [], 1, "in")
    value = codec.encode(RECORD_KEY, RecordKind.COMPLETION, completion, **HERE, fingerprint="fp1")
    decoded = codec.decode(RECORD_KEY, value, **HERE)
    assert (decoded.kind, decoded.fingerprint, decoded.payload, decoded.producer) == (
        RecordKind.COMPLETION.value, "fp1", completion, "agent-x")


def test_other_signing_key_is_rejected_before_unpickling():
    value = RecordCodec(KEY, "a").encode(RECORD_KEY, RecordKind.CALL, _call(object()), **HERE)
    with pytest.raises(SignatureError, match="neither the signing key nor one of the verification keys"):
        RecordCodec(b"z" * 32, "a").decode(RECORD_KEY, value, **HERE)


def test_tampered_payload_is_rejected():
    value = bytearray(RecordCodec(KEY, "a").encode(RECORD_KEY, RecordKind.CALL, _call("payload"), **HERE))
    value[-40] ^= 0xFF
    with pytest.raises(SignatureError):
        RecordCodec(KEY, "a").decode(RECORD_KEY, bytes(value), **HERE)


def test_record_moved_to_another_kafka_key_is_rejected():
    value = RecordCodec(KEY, "a").encode(RECORD_KEY, RecordKind.CALL, _call("payload"), **HERE)
    other_key = journal_key(7, 4, "ev", "classify", key_digest("customer:1"))
    with pytest.raises(SignatureError):
        RecordCodec(KEY, "a").decode(other_key, value, **HERE)


@pytest.mark.parametrize("value", [b"", b"not a record at all, just some bytes here......", None])
def test_foreign_bytes_are_rejected(value):
    with pytest.raises(SignatureError):
        RecordCodec(KEY, "a").decode(RECORD_KEY, value, **HERE)


def test_foreign_producer_is_rejected_even_with_the_right_key():
    value = RecordCodec(KEY, "job-1").encode(RECORD_KEY, RecordKind.CALL, _call("x"), **HERE)
    with pytest.raises(SignatureError, match="each agent needs its own journal topic"):
        RecordCodec(KEY, "job-2").decode(RECORD_KEY, value, **HERE)


def test_unknown_format_version_is_rejected():
    value = bytearray(RecordCodec(KEY, "a").encode(RECORD_KEY, RecordKind.CALL, _call("x"), **HERE))
    value[4] = 99
    with pytest.raises(SignatureError, match="format version 99"):
        RecordCodec(KEY, "a").decode(RECORD_KEY, bytes(value), **HERE)


def test_unpicklable_payload_names_what_it_was():
    import threading

    with pytest.raises(NotPicklableError, match="the result of call 0"):
        RecordCodec(KEY, "a").encode(RECORD_KEY, RecordKind.CALL, _call(threading.Lock()), **HERE,
                                     what="the result of call 0")


def test_short_signing_key_is_refused():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        RecordCodec(b"short", "a")


@pytest.mark.parametrize("key", ["a:b:c", "ключ:🦀", "", "1"])
def test_journal_keys_survive_colons_and_non_ascii_in_business_keys(key):
    raw = journal_key(12, 5, "e1", "act", key_digest(key))
    assert parse_journal_key(raw) == (12, 5, "e1", "act", key_digest(key))


def test_key_digest_distinguishes_types_and_values():
    assert key_digest(1) != key_digest("1")
    assert key_digest("a:b") != key_digest("a_b")
    assert key_digest("ключ") == key_digest("ключ")
