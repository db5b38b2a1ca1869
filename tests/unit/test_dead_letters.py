"""What the packaged jobs take from Kafka and what goes to the dead letters instead (no Flink needed here; the
jobs themselves: tests/integration/test_installed_wheel.py)."""

from __future__ import annotations

import json

import pytest

from flink_agents_replay.jobs.kafka_input import DEAD_LETTER_VERSION, DeadLetter, JsonRecords
from flink_agents_replay.replay.job import CapturedInputParser
from flink_agents_replay.storage.capture.records import CapturedInput

TAKE = JsonRecords("customer", max_record_bytes=89)


@pytest.mark.parametrize(("value", "reason"), [
    (None, "no value (a tombstone)"),
    (b"not json", "not JSON: Expecting value: line 1 column 1 (char 0)"),
    (b"\xff\xfe{}", "not UTF-8: 'utf-8' codec can't decode byte 0xff in position 0: invalid start byte"),
    (b'["customer"]', "not a JSON object: a list"),
    (b'"c1"', "not a JSON object: a str"),
    (b'{"text": "hi"}', "no key field 'customer'"),
    (b'{"customer": 7}', "key field 'customer' is not a string: 7"),
    (b'{"customer": null}', "key field 'customer' is not a string: None"),
    (b'{"customer": "c1", "text": "' + b"x" * 60 + b'"}', "larger than the limit: 90 bytes > 89"),
    (b"[" * 20 + b"]" * 20, "not a JSON object: a list"),
    (b'{"customer": "c", "a": ' + b"[" * 32 + b"]" * 32 + b"}", "nested deeper than 32 levels"),
])
def test_a_record_the_job_cannot_take_has_a_reason(value, reason):
    assert TAKE(value, 0) == (None, reason)


def test_a_record_nested_too_deep_for_json_or_the_journal_is_a_dead_letter_not_a_crash():
    take = JsonRecords("customer", max_record_bytes=10 ** 7)
    assert take(b"[" * 100_000 + b"]" * 100_000, 0) == (None, "nested deeper than 32 levels")  # RecursionError
    deep = b'{"customer": "c", "a": ' + b"[" * 31 + b"]" * 31 + b"}"
    assert take(deep, 0)[1] is None
    from flink_agents_replay.engine.digest import digest_value

    digest_value(take(deep, 0)[0])  # what the journal does with an input: the deepest taken record digests


@pytest.mark.parametrize("value", [b'{"customer": "x\\ud800y"}', b'{"customer": "c", "text": "\\udc80"}',
                                   b'{"customer": "c", "\\ud83d": 1}', b'{"customer": "c", "t": ["\\ud800"]}'])
def test_a_string_that_is_not_valid_unicode_is_a_dead_letter(value):
    record, reason = TAKE(value, 0)
    assert record is None and reason.startswith("a string is not valid Unicode (a lone surrogate)")


def test_the_fields_the_agent_reads_are_required():
    take = JsonRecords("customer", required=("ticket_id", "text"))
    assert take(b'{"customer": "c", "text": "hi"}', 0) == (None, "no field 'ticket_id' (the agent reads it)")
    assert take(b'{"customer": "c", "ticket_id": 1}', 0) == (None, "no field 'text' (the agent reads it)")
    assert take(b'{"customer": "c", "ticket_id": "T", "text": null}', 0)[1] is None
    assert take(b'not json', 0)[1].startswith("not JSON")


def test_an_acceptable_record_is_taken_as_its_object():
    assert TAKE(b'{"customer": "c\xc3\xa9", "n": 1}', 3) == ({"customer": "cé", "n": 1}, None)
    assert TAKE(b'{"customer": ""}', 0) == ({"customer": ""}, None)  # an empty key is still a key


def test_a_dead_letter_says_why_and_where_and_keeps_a_bounded_value():
    letter = json.loads(DeadLetter("not JSON: x", "tickets", 1, 41, 1700000000000, b"\xffbad" + b"y" * 20000).to_json())
    assert letter["v"] == DEAD_LETTER_VERSION == 1
    where = (letter["reason"], letter["topic"], letter["partition"], letter["offset"])
    assert where == ("not JSON: x", "tickets", 1, 41)
    assert letter["bytes"] == 20004 and letter["truncated"] is True
    assert letter["value"].startswith("\ufffdbad") and len(letter["value"]) == 16 * 1024
    tombstone = json.loads(DeadLetter("no value (a tombstone)", "tickets", 0, 1, 0, None).to_json())
    assert tombstone["value"] is None and tombstone["bytes"] == 0 and tombstone["truncated"] is False


def test_a_capture_record_that_does_not_verify_is_a_reason_not_an_exception():
    from flink_agents_replay.core.keygroups import key_group
    from flink_agents_replay.storage.capture.records import SIGNED_KEY
    from flink_agents_replay.storage.capture.schemas import CAPTURED_INPUT, capture_codec

    parse = CapturedInputParser(b"k" * 32, "op", topic="cap", key_type="STRING", max_parallelism=128)
    assert parse(None, 0) == (None, "no value (a tombstone)")
    record, reason = parse(b"hello", 5)
    assert record is None and "is not a flink-agents-replay record" in reason
    import struct

    kind_not_a_string = struct.pack(">4sBI", b"FARJ", 3, 12) + b'{"kind":[1]}' + b"\0" * 32
    assert parse(kind_not_a_string, 0)[1].endswith("has no kind")  # a TypeError before

    group = key_group("c1", "STRING", 128)
    captured = CapturedInput("c1", 1, None, {"customer": "c1"}, "in-1", key_group=group)
    encoded = capture_codec(b"k" * 32, "op").encode(SIGNED_KEY, CAPTURED_INPUT, captured, topic="cap", partition=None)
    assert parse(encoded, group)[0] == captured
    copied = parse(encoded, group + 1)  # the same record copied into another partition
    assert copied[0] is None and "copied to partition" in copied[1]
    other_key = CapturedInputParser(b"o" * 32, "op", topic="cap", key_type="STRING", max_parallelism=128)
    unverified = other_key(encoded, group)
    assert unverified[0] is None and unverified[1], unverified  # a reason, not a silent skip


def test_a_parse_that_raises_makes_a_dead_letter_and_counts_it():
    from types import SimpleNamespace

    from flink_agents_replay.jobs.kafka_input import _ParseRecords

    counted = []
    parse = _ParseRecords(lambda value, partition: {}["missing"], "dead-letters")
    parse.counter = SimpleNamespace(inc=lambda: counted.append(1))
    row = SimpleNamespace(topic="t", partition=2, offset=9, timestamp=5, value=b"{}")

    [(tag, text)] = list(parse.process_element(row, None))
    assert tag == "dead-letters" and counted == [1]
    assert json.loads(text)["reason"] == "the parse failed: KeyError: 'missing'"
    assert (json.loads(text)["partition"], json.loads(text)["offset"]) == (2, 9)


@pytest.mark.parametrize("jar", ["s3://bucket/connector.jar", "hdfs:///jars/c.jar", "local:///opt/flink/c.jar",
                                 "https://repo1.maven.org/maven2/c.jar", "/no/such/connector.jar"])
def test_a_connector_jar_the_client_cannot_load_is_a_config_error(jar):
    from flink_agents_replay.core.errors import ConfigError
    from flink_agents_replay.jobs.connector import _jar_url

    with pytest.raises(ConfigError, match="Kafka connector jar"):
        _jar_url(jar)


def test_a_connector_jar_is_taken_as_a_local_path_or_file_url(tmp_path):
    from flink_agents_replay.jobs.connector import _jar_url

    jar = tmp_path / "flink-sql-connector-kafka.jar"
    jar.write_bytes(b"PK")
    assert _jar_url(str(jar)) == jar.as_uri()
    assert _jar_url(jar.as_uri()) == jar.as_uri()
